#include "podium/actor/drive.h"

#include <utility>

#include "podium/actor/executor.h"

namespace podium::actor {
namespace internal {
namespace {
thread_local DriveTls tls;
}  // namespace

DriveTls& drive_tls() { return tls; }

bool HelpGate::enter() {
  std::lock_guard lock(mu_);
  if (closed_) return false;
  ++active_;
  return true;
}

void HelpGate::leave() {
  std::lock_guard lock(mu_);
  if (--active_ == 0) cv_.notify_all();
}

void HelpGate::close_and_wait() {
  std::unique_lock lock(mu_);
  closed_ = true;
  int mine = tls.helping == this ? 1 : 0;
  cv_.wait(lock, [&] { return active_ <= mine; });
}

ActorScope::ActorScope(const ActorId* id, const std::string* text, uint64_t stream)
    : tls_(tls), outer_(tls.actor), outer_text_(tls.actor_text), outer_stream_(tls.actor_stream) {
  tls_.actor = id;
  tls_.actor_text = text;
  tls_.actor_stream = stream;
}

ActorScope::~ActorScope() {
  tls_.actor = outer_;
  tls_.actor_text = outer_text_;
  tls_.actor_stream = outer_stream_;
}

}  // namespace internal

using internal::tls;

const ActorId* current_actor() { return tls.actor; }
const std::string* current_actor_text() { return tls.actor_text; }

DeliveryOnlyScope::DeliveryOnlyScope()
    : outer_active_(tls.delivery_only), outer_deferred_(tls.deferred) {
  tls.delivery_only = true;
  tls.deferred = false;
}

DeliveryOnlyScope::~DeliveryOnlyScope() {
  tls.delivery_only = outer_active_;
  tls.deferred = outer_deferred_;
}

bool DeliveryOnlyScope::deferred() { return tls.deferred; }

void help_while_waiting() {
  internal::HelpCandidate h = std::exchange(tls.help, internal::HelpCandidate{});
  if (Executor::current()) return;
  auto gate = h.gate.lock();
  auto mailbox = h.mailbox.lock();
  if (!gate || !mailbox || !h.drain) return;
  // AC-17: the proc cannot end while this thread is inside its gate.
  if (!gate->enter()) return;
  const internal::HelpGate* outer = std::exchange(tls.helping, gate.get());
  h.drain(h.impl, mailbox);
  tls.helping = outer;
  gate->leave();
}

}  // namespace podium::actor
