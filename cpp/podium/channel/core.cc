#include "podium/channel/core.h"

namespace podium::channel::internal {
namespace {

thread_local Gate::Scope* tl_innermost = nullptr;

}  // namespace

Core::Core(asio::io_context& io, Config config, DeliverFn deliver, UndeliverableFn undeliverable)
    : io(io),
      config(std::move(config)),
      deliver(std::move(deliver)),
      undeliverable(std::move(undeliverable)) {
  if (!this->config.tls.enabled()) return;
  auto ctx = TlsContext::make(this->config.tls);
  if (ctx) {
    tls = std::move(*ctx);
  } else {
    tls_error = ctx.error().message;
  }
}

void Core::count(Refusal r) {
  auto bump = [](std::atomic<uint64_t>& c) { c.fetch_add(1, std::memory_order_relaxed); };
  switch (r) {
    case Refusal::kNone: return;
    case Refusal::kOversize: return bump(counters.refused_oversize);
    case Refusal::kMalformed: return bump(counters.refused_malformed);
    case Refusal::kAuth: return bump(counters.refused_auth);
    case Refusal::kTimeout: return bump(counters.handshake_timeouts);
    case Refusal::kLocal: return bump(counters.setup_errors);
  }
}

Gate::Scope::Scope(Gate& g) : gate_(g), outer_(tl_innermost) {
  // seq_cst on both sides: either close_and_wait() sees this increment, or this load sees
  // the close.
  g.active_.fetch_add(1);
  entered_ = !g.closed_.load();
  if (entered_) {
    tl_innermost = this;
  } else if (g.active_.fetch_sub(1) == 1) {
    g.active_.notify_all();
  }
}

Gate::Scope::~Scope() {
  if (!entered_) return;
  tl_innermost = outer_;
  if (gate_.active_.fetch_sub(1) == 1 && gate_.closed_.load()) gate_.active_.notify_all();
}

void Gate::close_and_wait() {
  closed_.store(true);
  uint32_t own = 0;
  for (Scope* s = tl_innermost; s; s = s->outer_) own += &s->gate_ == this;
  for (uint32_t n = active_.load(); n > own; n = active_.load()) active_.wait(n);
}

void hand_back(Core& core, std::vector<Outgoing>& out, ChannelErrc code,
               const std::string& reason) {
  for (Outgoing& o : out) {
    // GW-3: an envelope for another address goes back as it was sent, without its wrapper.
    auto& h = o.env.headers;
    if (core.config.via && !h.empty() && h.back().first == kViaToHeader) h.pop_back();
    core.undeliverable(std::move(o.env), make_error(code, reason));
  }
  out.clear();
}

BatchEnd::~BatchEnd() {
  if (delivered && core.batch_end) core.batch_end();
}

}  // namespace podium::channel::internal
