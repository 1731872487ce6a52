// podium::actor::Future<T> / Promise<T> — the result of a call, set once, read many times.
//
// get() waits (spinning briefly, then sleeping; see Signal) and returns the same Result on
// every call. get(timeout) returns an ActorErrc::kTimeout error when the result is not there
// in time, and does not consume it: a later get() still sees the value. on_ready() runs a
// callback once the value is set (at once if it already is), on the thread that sets it or
// the thread that registers it — callbacks must not block.
//
// Threads: every member is thread-safe.
// Invariants:
//   AC-4 A Promise sets its Future at most once; a second set() is ignored.
//   AC-5 A Promise destroyed unset sets its Future to a kCancelled error (no waiter hangs).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "podium/actor/ids.h"
#include "podium/actor/signal.h"
#include "podium/base/error.h"

namespace podium::actor {

namespace detail {
template <class T>
struct FutureState {
  Signal signal;
  std::mutex mu;                        // guards value before signal, callbacks
  std::optional<Result<T>> value;       // written once under mu, read after signal
  std::vector<std::function<void(const Result<T>&)>> callbacks;  // guarded by mu

  bool set(Result<T>&& v) {
    std::vector<std::function<void(const Result<T>&)>> cbs;
    {
      std::lock_guard lock(mu);
      if (value) return false;
      value.emplace(std::move(v));
      cbs.swap(callbacks);
    }
    signal.set();
    for (auto& cb : cbs) cb(*value);
    return true;
  }
};
}  // namespace detail

template <class T>
class Future {
 public:
  Future() = default;
  explicit Future(std::shared_ptr<detail::FutureState<T>> st) : st_(std::move(st)) {}

  bool valid() const { return st_ != nullptr; }
  bool ready() const { return st_->signal.is_set(); }

  const Result<T>& get() const {
    st_->signal.wait();
    return *st_->value;
  }

  Result<T> get(std::chrono::nanoseconds timeout) const {
    if (!st_->signal.wait_for(timeout)) {
      return std::unexpected(make_error(
          ActorErrc::kTimeout, "no result within " +
                                   std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      timeout)
                                                      .count()) +
                                   " ms"));
    }
    return *st_->value;
  }

  // One slice of an untimed wait (Signal::wait_slice): true once ready.
  bool wait_slice(std::chrono::nanoseconds timeout) const {
    return st_->signal.wait_slice(timeout);
  }

  void on_ready(std::function<void(const Result<T>&)> cb) const {
    {
      std::lock_guard lock(st_->mu);
      if (!st_->value) {
        st_->callbacks.push_back(std::move(cb));
        return;
      }
    }
    cb(*st_->value);
  }

 private:
  std::shared_ptr<detail::FutureState<T>> st_;
};

template <class T>
class Promise {
 public:
  Promise() : st_(std::make_shared<detail::FutureState<T>>()) {}
  Promise(Promise&&) noexcept = default;
  Promise& operator=(Promise&&) noexcept = default;
  Promise(const Promise&) = delete;
  Promise& operator=(const Promise&) = delete;
  ~Promise() {
    if (st_) st_->set(std::unexpected(make_error(BaseErrc::kCancelled, "promise abandoned")));
  }

  Future<T> future() const { return Future<T>(st_); }
  bool set(Result<T> v) { return st_->set(std::move(v)); }

 private:
  std::shared_ptr<detail::FutureState<T>> st_;
};

}  // namespace podium::actor
