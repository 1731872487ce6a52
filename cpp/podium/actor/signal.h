// podium::actor::Signal — a one-shot event that a waiter sees within microseconds.
//
// A waiting thread first spins for a short, bounded time (the reply to a call on this host
// usually lands within it), then sleeps on a futex. set() costs one atomic exchange, plus one
// futex wake only when a waiter is asleep.
//
// Threads: set(), is_set() and the waits may be called from any thread.
// Invariants:
//   AC-1 Once set, a Signal stays set; every current and later wait returns true.
//   AC-15 A wait with a timeout returns within that timeout (plus scheduling) when unset.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace podium::actor {

class Signal {
 public:
  void set();
  bool is_set() const { return state_.load(std::memory_order_acquire) == kSet; }
  // Without a timeout, a thread outside the runtime first runs the local mailbox it scheduled
  // last, if no runner has picked it up (help_while_waiting() in proc.h).
  void wait();
  // Returns false when `timeout` passed without set().
  bool wait_for(std::chrono::nanoseconds timeout);
  // One slice of an untimed wait (a Python get() without timeout wakes every 100 ms to check
  // for signals): waits like wait(), helping and driving, and gives up after `timeout`. A
  // handler this thread runs while it drives may overrun the slice, so a caller with a real
  // deadline uses wait_for().
  bool wait_slice(std::chrono::nanoseconds timeout);

  // How long a waiter spins before sleeping; 0 disables spinning. Process-wide.
  static void set_spin(std::chrono::nanoseconds spin);

 private:
  static constexpr uint32_t kUnset = 0;
  static constexpr uint32_t kSet = 1;
  static constexpr uint32_t kSleeping = 2;  // unset, and at least one waiter is in futex_wait

  bool spin_until_set(std::chrono::steady_clock::time_point deadline) const;

  std::atomic<uint32_t> state_{kUnset};
};

}  // namespace podium::actor
