// podium::actor::Executor — the threads that run a proc's io_context.
//
// One runner thread normally runs the io_context: it reads sockets, routes messages and runs
// actor handlers where the message lands, so a request and its reply cost no thread hop.
// A handler that runs long, or blocks (a Future wait inside a handler), must not stall the
// proc's other actors or its I/O, so the executor adds runners when every runner is occupied:
//   - at once, when a runner is about to block (BlockingScope);
//   - from a watchdog, when every runner has been inside the same handler for a tick (2 ms);
//     while no runner is occupied the watchdog's tick grows to 32 ms (executor.cc).
// Surplus runners retire when they find nothing occupied, so the proc returns to one runner.
// The watchdog parks after a quiet period and is woken by the next handler.
//
// Threads: start() and stop() from a non-runner thread. handler_begin()/handler_end() and
// BlockingScope are called on runner threads. current() from any thread.
// Invariants:
//   AC-2 While any actor has work queued, at least one runner is free to run it within one
//        watchdog tick (2 ms) plus, when the handlers that hold the runners started after an
//        idle spell, one idle tick (at most 32 ms), however many handlers are long-running or
//        blocked (up to max_runners). A runner about to block hands off at once.
//   AC-3 stop() returns only after every runner and the watchdog have exited.
//   AC-21 A caller that drives the loop (drive()) returns only after it also ran the handlers
//        ready when its wait completed (at most kDrainAfterDone): the work that messages read
//        before its reply queued (a supervision event's delivery to the system actor) has
//        taken effect when it goes on, as if the loop's runner had read them and woken it.
//   AC-22 While a caller drives the loop, the parked primary runner sleeps until that caller
//        releases the loop or gives up taking it, with no timed wake-up: a proc whose main
//        thread drives the loop all the while it serves wakes no runner while it is idle (it
//        woke every kReclaimAfter, about 940 times a second, before). A caller that drives
//        call after call wakes it at most once per kReclaimAfter, not at every release.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace asio {
class io_context;
}

namespace podium::actor {

// AC-21: the most handlers a driving caller runs after its wait completed.
inline constexpr int kDrainAfterDone = 16;

class Executor {
 public:
  explicit Executor(asio::io_context& io, size_t max_runners = 512);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void start();
  void stop();

  // The executor whose runner is the calling thread, or nullptr.
  static Executor* current();

  // Brackets an actor handler on a runner thread (the watchdog's view of "occupied").
  void handler_begin();
  void handler_end();

  size_t runner_count() const;

  // Caller driving: a thread outside the runtime that waits for a reply runs the io_context
  // itself until done() or the deadline, so the reply is read on the thread that waits for it
  // (no hand-off from a runner). The primary runner steps aside while callers drive and
  // takes the loop back kReclaimAfter (1 ms) after the last one stopped. Returns done(), or
  // false without driving when another caller drives (it serves this caller's reply too) or
  // when called on a runner thread. Thread-safe.
  bool drive(const std::function<bool()>& done, std::chrono::steady_clock::time_point deadline);

  // Waiting for the loop. A thread that waits for work rather than for one reply (a Python
  // actor's thread between messages) calls drive(); when that returns because another
  // thread drives, it sleeps on its own condition until its work comes or the loop is
  // released. on_release(wake) registers `wake`, which the executor calls once when a driver
  // releases the loop, for the longest-registered waiter only: that one takes the loop over
  // and the others sleep on (no thundering herd). Returns 0, registering nothing, when the
  // loop can be taken now; else a token for cancel_release(). Thread-safe.
  uint64_t on_release(std::function<void()> wake);
  void cancel_release(uint64_t token);
  // A driver that stopped because it left work it must not run (DeliveryOnlyScope) gives
  // the loop back to the primary runner at once instead of kReclaimAfter later; drivers
  // wait until the primary has it.
  void hand_back();

  // Adaptive polling (see executor.cc): how long an idle runner, and a driving caller, poll
  // the reactor after an event before they sleep. Process-wide; PODIUM_POLL_US sets both
  // at start-up (default 50 µs). Polling pays only where the polling thread has a core of
  // its own, so a process whose handlers run on other threads (Python) polls less.
  static void set_poll(std::chrono::nanoseconds runners, std::chrono::nanoseconds drivers);

  // The executor that untimed waits outside the runtime drive (the process's root proc).
  static void set_drivable(Executor* executor);
  static Executor* drivable();

 private:
  friend class BlockingScope;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Marks the calling runner thread as blocked for its lifetime, adding a runner first if no
// other would be free. Does nothing on a thread that is not a runner.
class BlockingScope {
 public:
  BlockingScope();
  ~BlockingScope();
  BlockingScope(const BlockingScope&) = delete;
  BlockingScope& operator=(const BlockingScope&) = delete;
  bool active() const { return slot_ != nullptr; }

 private:
  void* slot_ = nullptr;
  Executor* executor_ = nullptr;
};

}  // namespace podium::actor
