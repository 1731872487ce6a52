// podium::actor busy-wait policy — when polling and spinning pay, and when they do not.
//
// Two waits trade a core for a saved wake-up: the Executor's adaptive polling (a runner or a
// driving caller polls the reactor for up to PODIUM_POLL_US before it sleeps in epoll_wait)
// and Signal's spin (a waiter spins up to PODIUM_SPIN_US before it sleeps on a futex). Both
// pay only while the waiting thread has a core to itself. When more threads are runnable than
// there are cores (a compiler running, the 8 procs of a mesh on a 2-core machine), a busy
// thread takes the core that the thread it waits for needs, and when it is preempted it is
// runnable, not sleeping: its message then waits for its next time slice (milliseconds),
// where a thread sleeping in epoll_wait or on a futex would have been woken and run at once.
// On the 2-core development machine with one CPU-bound process beside it, polling put the
// median Python `call_one` at 155 µs against 51 µs without it.
//
// So a busy-wait starts only when the machine has a core to spare, and ends as soon as it
// sees that it lost its core:
//   - Cores to spare: at most every kLoadCheck, one thread of the process reads the number of
//     runnable threads (/proc/loadavg, which counts busy-waiting threads too) and compares it
//     with the cores this process may run on. While runnable > cores, no busy-wait starts.
//   - Lost core: a gap of more than kPreemptedGap between two of a busy-wait's clock checks
//     (which it reads anyway) means it was descheduled; it stops, and no busy-wait of that
//     thread starts for kBackoff. The gap is long on purpose: a virtual machine's vCPU
//     pauses for tens of microseconds now and then with nothing else runnable, and a 30 µs
//     threshold took polling away from an idle machine (call_one 150 µs instead of 32 µs).
// Both verdicts expire, so a machine that becomes idle gets its polling back within
// kLoadCheck (and a thread within kBackoff).
//
// Threads: BusyWaitGuard is per thread (a thread_local in busy_wait.cc); the load verdict is
// process-wide, in atomics.
// Invariants:
//   AC-19 A busy-wait that sees a gap of more than kPreemptedGap between two of its clock
//        checks ends at once, and no busy-wait of that thread starts again until kBackoff
//        after that check: the thread sleeps instead, to be woken by the event.
//   AC-20 No busy-wait starts while the last load reading (at most kLoadCheck old) found more
//        runnable threads than the cores this process may use.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

namespace podium::actor {

class BusyWaitGuard {
 public:
  using Clock = std::chrono::steady_clock;
  static const std::chrono::nanoseconds kPreemptedGap;  // 250 µs; PODIUM_PREEMPT_GAP_US
  static constexpr std::chrono::milliseconds kBackoff{50};
  static constexpr std::chrono::milliseconds kLoadCheck{10};

  // Whether a busy-wait may start at `now`: this thread is not backing off (AC-19) and the
  // machine has a core to spare (AC-20).
  bool may_start(Clock::time_point now) const {
    return !backing_off(now) && cores_to_spare(now);
  }
  // AC-19: whether this thread lost its core less than kBackoff before `now`.
  bool backing_off(Clock::time_point now) const { return now < no_busy_until_; }
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

  // AC-20: false while the last reading of the machine's load (taken now if the last is
  // older than kLoadCheck) found more runnable threads than cores. Process-wide.
  static bool cores_to_spare(Clock::time_point now);
  // The runnable-thread count of a /proc/loadavg line ("0.00 0.01 0.05 3/123 4567" -> 3),
  // or nullopt when it does not parse.
  static std::optional<unsigned> runnable_of(std::string_view loadavg);
  // The verdict for `runnable` threads on `cores` cores.
  static bool spare(unsigned runnable, unsigned cores) { return runnable <= cores; }

 private:
  Clock::time_point last_{};
  Clock::time_point no_busy_until_{};
  uint64_t preemptions_ = 0;
};

}  // namespace podium::actor
