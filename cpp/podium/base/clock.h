// podium::base::Clock — the time the core's timers read, injectable for tests.
//
// Every timer of the core (the actor layer's ordering gap, the channel's delivery timeout,
// handshake deadline, ack delay, reconnect backoff, ...) is a base::Timer (clock_timer.h, which holds the Asio part) on a Clock, and every
// deadline it computes comes from Clock::now(). Production code passes no clock (nullptr):
// the Timer is then an asio::steady_timer on the owner's io_context and now() is
// std::chrono::steady_clock, exactly as before (CK-4). A test passes a ManualClock instead:
// time stands still until the test calls advance(d), which runs every timer that falls due on
// the calling thread before it returns, so a test of a 10 s timeout takes no wall time and
// cannot flake under load.
//
// Threads: Clock::now(), ManualClock::advance()/now()/pending() and every Timer member are
// thread-safe. advance() runs due handlers on its caller's thread, without holding the
// clock's lock (a handler may arm or cancel timers, and read now()); one advance() at a time
// runs handlers (a second one waits for it).
// Invariants:
//   CK-1 A ManualClock's now() starts at the time it was made and moves only through
//        advance(); it never goes back.
//   CK-2 advance(d) runs, before it returns and on its caller's thread, every wait whose
//        expiry is at or before now() + d, in order of expiry (ties: in the order they were
//        armed), with now() equal to that wait's expiry while its handler runs; waits that
//        those handlers arm inside the window run too. It then sets now() to the old
//        now() + d. A wait whose expiry is already past when it is armed runs at the next
//        advance (advance(0) included), never inside async_wait().
//   CK-3 A wait that is cancelled (cancel(), a new expiry, or the Timer's destruction) never
//        runs as expired: its handler is posted to the Timer's io_context with
//        asio::error::operation_aborted, as an asio timer does, never run inside the call
//        that cancelled it (which may hold the owner's lock). A wait still pending when its
//        io_context is destroyed is destroyed with it, unrun, as an asio timer's handler is.
//   CK-4 With no clock (nullptr), a Timer is an asio::steady_timer and now() is
//        std::chrono::steady_clock::now(): production timing and cost are unchanged.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <system_error>

namespace asio {
class io_context;
}

namespace podium::base {

using SteadyTime = std::chrono::steady_clock::time_point;

class ManualClock;

class Clock {
 public:
  using duration = std::chrono::steady_clock::duration;
  using time_point = SteadyTime;
  virtual ~Clock() = default;
  virtual time_point now() const = 0;
  // The ManualClock behind this clock, or nullptr when timers use the io_context's own
  // timer queue (the real clock).
  virtual ManualClock* manual() { return nullptr; }
};

// std::chrono::steady_clock.
class RealClock final : public Clock {
 public:
  time_point now() const override { return std::chrono::steady_clock::now(); }
};

// `clock`'s now(), or steady_clock's when `clock` is null (CK-4).
inline SteadyTime now_of(const Clock* clock) {
  return clock ? clock->now() : std::chrono::steady_clock::now();
}
inline SteadyTime now_of(const std::shared_ptr<Clock>& clock) { return now_of(clock.get()); }

// Virtual time for tests (CK-1..CK-3).
class ManualClock final : public Clock {
 public:
  using Handler = std::function<void(const std::error_code&)>;

  ManualClock();
  ~ManualClock() override;
  ManualClock(const ManualClock&) = delete;
  ManualClock& operator=(const ManualClock&) = delete;

  time_point now() const override;
  ManualClock* manual() override { return this; }

  // Moves time forward by `d`, running every wait that falls due (CK-2). Returns how many
  // handlers it ran.
  size_t advance(duration d);
  // Waits armed and not yet run or cancelled.
  size_t pending() const;
  // The earliest pending expiry, if any.
  std::optional<time_point> next_expiry() const;

  // Timer's side: arms wait `id` (a new one per async_wait) at `at`; cancel() takes it out
  // and posts its handler with operation_aborted to `io` (CK-3). True when it was pending.
  uint64_t arm(time_point at, asio::io_context& io, Handler handler);
  bool cancel(uint64_t id);

  struct State;  // clock.cc

 private:
  std::shared_ptr<State> state_;
};

}  // namespace podium::base
