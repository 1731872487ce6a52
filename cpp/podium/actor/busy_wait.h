// podium::actor busy-wait policy — when polling and spinning pay, and when they do not.
//
// Two waits trade a core for a saved wake-up: the Executor's adaptive polling (a runner or a
// driving caller polls the reactor for up to PODIUM_POLL_US before it sleeps in epoll_wait)
// and Signal's spin (a waiter spins up to PODIUM_SPIN_US before it sleeps on a futex). Both
// pay only while the waiting thread keeps its core. When another runnable thread shares the
// core (a compiler, the other procs of a mesh on a machine with fewer cores than procs), the
// scheduler preempts the busy thread. A preempted thread is runnable, not sleeping: when its
// message lands it waits for its next time slice (milliseconds under load), where a thread
// sleeping in epoll_wait or on a futex would have been woken, and usually run, at once. On
// the 2-core development machine with one compiler running, polling put the median Python
// `call_one` at 148 µs against 51 µs without it.
//
// So a busy-wait watches the clock it reads anyway. A gap of more than kPreemptedGap between
// two of its checks means it lost the core; it then stops and sleeps, and so does every
// busy-wait of that thread for the next kBackoff. After that it tries again, so a machine
// that becomes idle gets its polling back within kBackoff.
//
// Threads: BusyWaitGuard is per thread (a thread_local in busy_wait.cc); nothing is shared.
// Invariants:
//   AC-19 A busy-wait that sees a gap of more than kPreemptedGap between two of its clock
//        checks ends at once, and no busy-wait of that thread starts again until kBackoff
//        after that check: the thread sleeps instead, to be woken by the event.
#pragma once

#include <chrono>
#include <cstdint>

namespace podium::actor {

class BusyWaitGuard {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::nanoseconds kPreemptedGap{30'000};
  static constexpr std::chrono::milliseconds kBackoff{50};

  // Whether a busy-wait may start at `now` (false while backing off).
  bool may_start(Clock::time_point now) const { return now >= no_busy_until_; }
  // Starts a busy-wait whose first clock check is `now`.
  void start(Clock::time_point now) { last_ = now; }
  // One check of the busy-wait at `now`: false when the thread lost its core since the last
  // check (the wait must end, and the backoff starts), true otherwise.
  bool check(Clock::time_point now) {
    if (now - last_ > kPreemptedGap) {
      no_busy_until_ = now + kBackoff;
      ++preemptions_;
      return false;
    }
    last_ = now;
    return true;
  }
  uint64_t preemptions() const { return preemptions_; }

  // This thread's guard.
  static BusyWaitGuard& mine();

 private:
  Clock::time_point last_{};
  Clock::time_point no_busy_until_{};
  uint64_t preemptions_ = 0;
};

}  // namespace podium::actor
