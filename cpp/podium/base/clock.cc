#include "podium/base/clock_timer.h"

#include <asio/post.hpp>

#include <condition_variable>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace podium::base {

// The waits of one ManualClock, ordered by (expiry, arming order).
struct ManualClock::State {
  struct Wait {
    asio::io_context* io;
    Handler handler;
  };
  mutable std::mutex mu;
  time_point now;
  uint64_t next_id = 1;
  std::map<std::pair<time_point, uint64_t>, Wait> waits;
  std::unordered_map<uint64_t, time_point> expiry_of;  // id -> key in waits
  // One advance() runs handlers at a time (CK-2's order holds across callers).
  std::mutex advancing;

  // Takes out every wait of `io` (its io_context is going away); destroyed by the caller
  // outside `mu`.
  std::vector<Handler> drop_all(asio::io_context* io) {
    std::vector<Handler> out;
    std::lock_guard lock(mu);
    for (auto it = waits.begin(); it != waits.end();) {
      if (it->second.io == io) {
        out.push_back(std::move(it->second.handler));
        expiry_of.erase(it->first.second);
        it = waits.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }
};

namespace {

// Ties a ManualClock's waits to the io_context they belong to: when the io_context is
// destroyed, its waits are destroyed unrun, as its own timers' handlers are (CK-3).
class ManualWaits final : public asio::execution_context::service {
 public:
  static inline asio::execution_context::id id;
  explicit ManualWaits(asio::execution_context& ctx)
      : asio::execution_context::service(ctx), io_(static_cast<asio::io_context*>(&ctx)) {}

  void track(const std::shared_ptr<ManualClock::State>& s) {
    std::lock_guard lock(mu_);
    std::erase_if(states_, [](const auto& w) { return w.expired(); });
    for (auto& w : states_) {
      if (w.lock() == s) return;
    }
    states_.push_back(s);
  }

  void shutdown() override {
    std::vector<std::weak_ptr<ManualClock::State>> states;
    {
      std::lock_guard lock(mu_);
      states.swap(states_);
    }
    for (auto& w : states) {
      if (auto s = w.lock()) {
        auto dropped = s->drop_all(io_);
        dropped.clear();  // may destroy the objects the handlers held, outside every lock
      }
    }
  }

 private:
  asio::io_context* io_;
  std::mutex mu_;
  std::vector<std::weak_ptr<ManualClock::State>> states_;
};

}  // namespace

ManualClock::ManualClock() : state_(std::make_shared<State>()) {
  state_->now = std::chrono::steady_clock::now();
}

ManualClock::~ManualClock() = default;

ManualClock::time_point ManualClock::now() const {
  std::lock_guard lock(state_->mu);
  return state_->now;
}

size_t ManualClock::pending() const {
  std::lock_guard lock(state_->mu);
  return state_->waits.size();
}

std::optional<ManualClock::time_point> ManualClock::next_expiry() const {
  std::lock_guard lock(state_->mu);
  if (state_->waits.empty()) return std::nullopt;
  return state_->waits.begin()->first.first;
}

uint64_t ManualClock::arm(time_point at, asio::io_context& io, Handler handler) {
  asio::use_service<ManualWaits>(io).track(state_);
  std::lock_guard lock(state_->mu);
  uint64_t id = state_->next_id++;
  state_->waits.emplace(std::make_pair(at, id), State::Wait{&io, std::move(handler)});
  state_->expiry_of.emplace(id, at);
  return id;
}

bool ManualClock::cancel(uint64_t id) {
  State::Wait wait;
  {
    std::lock_guard lock(state_->mu);
    auto e = state_->expiry_of.find(id);
    if (e == state_->expiry_of.end()) return false;
    auto it = state_->waits.find({e->second, id});
    wait = std::move(it->second);
    state_->waits.erase(it);
    state_->expiry_of.erase(e);
  }
  // CK-3: as asio does, the handler hears operation_aborted on its io_context.
  asio::post(*wait.io, [h = std::move(wait.handler)]() mutable {
    h(asio::error::operation_aborted);
  });
  return true;
}

size_t ManualClock::advance(duration d) {
  std::lock_guard advancing(state_->advancing);
  time_point target;
  {
    std::lock_guard lock(state_->mu);
    target = state_->now + d;
  }
  size_t ran = 0;
  for (;;) {
    Handler h;
    {
      std::lock_guard lock(state_->mu);
      auto it = state_->waits.begin();
      if (it == state_->waits.end() || it->first.first > target) {
        state_->now = std::max(state_->now, target);
        return ran;
      }
      state_->now = std::max(state_->now, it->first.first);
      h = std::move(it->second.handler);
      state_->expiry_of.erase(it->first.second);
      state_->waits.erase(it);
    }
    h(std::error_code());
    ++ran;
  }
}

// ---- Timer ----

Timer::Timer(asio::io_context& io, std::shared_ptr<Clock> clock)
    : io_(io), clock_(std::move(clock)), manual_(clock_ ? clock_->manual() : nullptr) {
  if (!manual_) real_.emplace(io);
}

Timer::~Timer() { cancel_manual(); }

void Timer::expires_at(SteadyTime at) {
  expiry_ = at;
  if (real_) {
    real_->expires_at(at);
  } else {
    cancel_manual();
  }
}

void Timer::cancel() {
  if (real_) {
    real_->cancel();
  } else {
    cancel_manual();
  }
}

void Timer::cancel_manual() {
  if (uint64_t w = std::exchange(wait_, 0)) manual_->cancel(w);
}

}  // namespace podium::base
