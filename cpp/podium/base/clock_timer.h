// podium::base::Timer — a one-shot timer on a Clock (clock.h), for code that runs on an
// asio::io_context. Kept apart from clock.h so that headers which only name a Clock (configs)
// do not pull in Asio.
//
// Threads: as an asio timer: its owner serialises calls (under its own mutex).
// Invariants: CK-2..CK-4 (clock.h).
#pragma once

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <memory>
#include <optional>
#include <system_error>

#include "podium/base/clock.h"

namespace podium::base {

// A one-shot timer with asio::steady_timer's interface (the part the core uses), on a Clock.
// With a null clock it is an asio::steady_timer; with a ManualClock its waits run in advance().
// Like asio's, setting a new expiry cancels the pending wait. Thread-safe only as far as an
// asio timer is: the owner serialises its calls (its own mutex).
class Timer {
 public:
  // A null clock, or one that is not a ManualClock, runs on the io_context's timer queue.
  Timer(asio::io_context& io, std::shared_ptr<Clock> clock = nullptr);
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  void expires_at(SteadyTime at);
  void expires_after(Clock::duration d) { expires_at(now() + d); }
  SteadyTime expiry() const { return expiry_; }
  SteadyTime now() const { return now_of(clock_.get()); }
  // `handler(ec)` runs once: with no error at the expiry, or with operation_aborted once
  // cancelled (CK-3).
  template <class Handler>
  void async_wait(Handler&& handler) {
    if (real_) {
      real_->async_wait(std::forward<Handler>(handler));
      return;
    }
    cancel_manual();
    wait_ = manual_->arm(expiry_, io_, ManualClock::Handler(std::forward<Handler>(handler)));
  }
  void cancel();

 private:
  void cancel_manual();

  asio::io_context& io_;
  std::shared_ptr<Clock> clock_;  // null: the real clock
  ManualClock* manual_ = nullptr;  // clock_'s ManualClock, if it is one
  std::optional<asio::steady_timer> real_;
  SteadyTime expiry_{};
  uint64_t wait_ = 0;  // the ManualClock wait armed, 0 when none
};

}  // namespace podium::base
