#include "podium/channel/net.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "podium/base/env.h"
#include "podium/channel/core.h"
#include "podium/channel/inbound.h"
#include "podium/channel/inproc.h"
#include "podium/channel/link.h"
#include "podium/channel/pull.h"
#include "podium/channel/shared_parts.h"
#include "podium/channel/socket_util.h"
#include "podium/wire/message.h"

namespace podium::channel {

using internal::Core;

struct Net::Impl {
  std::shared_ptr<Core> core;
};

Net::Net(asio::io_context& io, Config config, DeliverFn deliver, UndeliverableFn undeliverable)
    : impl_(std::make_unique<Impl>(Impl{std::make_shared<Core>(
          io, config, std::move(deliver), std::move(undeliverable))})) {}

Net::~Net() {
  stop();
  // Dropping the links breaks the Core <-> Link cycle.
  std::unordered_map<Address, std::shared_ptr<internal::Link>> links;
  std::lock_guard lock(impl_->core->mu);
  links.swap(impl_->core->links);
}

const Config& Net::config() const { return impl_->core->config; }

NetStats Net::stats() const {
  const auto& c = impl_->core->counters;
  auto get = [](const std::atomic<uint64_t>& v) { return v.load(std::memory_order_relaxed); };
  NetStats s{get(c.refused_oversize), get(c.refused_malformed), get(c.refused_auth),
             get(c.handshake_timeouts), get(c.unauthenticated_cap_hits),
             get(c.setup_errors)};
  // A link's mutex comes before the registry's: copy the links out first.
  std::vector<std::shared_ptr<internal::Link>> links;
  {
    std::lock_guard lock(impl_->core->mu);
    for (const auto& [addr, link] : impl_->core->links) links.push_back(link);
  }
  for (const auto& link : links) s.lent_parts += link->lent_parts();
  auto pulls = internal::pull_counts();
  s.pulls = pulls.started;
  s.pull_failures = pulls.failed;
  auto shared = internal::shared_counts();
  s.shared_copied = shared.copied;
  s.shared_blocks_made = shared.blocks_made;
  s.shared_mapped = shared.mapped;
  s.shared_map_failed = shared.map_failed;
  return s;
}

size_t Config::default_lend_min_bytes() {
  size_t n = size_t(env_number("PODIUM_CMA_PART_MIN").value_or(size_t{512} << 10));
  return n == 0 ? 0 : std::max(n, wire::kMinLendBytes);
}

size_t Config::default_shared_part_min_bytes() {
  return size_t(env_number("PODIUM_SHARED_PART_MIN").value_or(size_t{1} << 20));
}

Result<Address> Net::listen(const Address& addr, int fd) {
  const auto& core = impl_->core;
  auto stopped = [&] {
    return std::unexpected(
        make_error(ChannelErrc::kListenFailed, "listen on " + addr.to_string() + ": net stopped"));
  };
  {
    std::lock_guard lock(core->mu);
    if (core->stopped) return stopped();
  }
  if (addr.transport == Transport::kTcp && core->tls_enabled() && !core->tls) {
    return std::unexpected(make_error(ChannelErrc::kTlsFailed,
                                      "listen on " + addr.to_string() + ": " + core->tls_error));
  }
  std::shared_ptr<internal::ListenerBase> listener;
  Address bound = addr;
  if (addr.transport == Transport::kInproc) {
    auto l = internal::InprocListener::listen(core, addr.target);
    if (!l) return std::unexpected(l.error());
    listener = *l;
  } else {
    auto l = internal::SocketListener::listen(core, addr, fd);
    if (!l) return std::unexpected(l.error());
    bound = (*l)->bound();
    listener = *l;
  }
  {
    std::lock_guard lock(core->mu);
    if (!core->stopped) {
      core->listeners.push_back(listener);
      if (core->self_address.empty()) core->self_address = bound.to_string();
      return bound;
    }
  }
  listener->close();
  return stopped();
}

void Net::send(const Address& to, wire::Envelope env) {
  internal::net_send(impl_->core, to, std::move(env));
}

void internal::net_send(const std::shared_ptr<Core>& core_ptr, const Address& dest,
                        wire::Envelope env) {
  Core& core = *core_ptr;
  // GW-3: a client behind a gateway reaches every other TCP address over its one link to the
  // gateway, the envelope naming where it goes.
  bool wrapped = core.config.via && dest.transport == Transport::kTcp && dest != *core.config.via;
  if (wrapped) env.headers.emplace_back(std::string(internal::kViaToHeader), dest.to_string());
  const Address& to = wrapped ? *core.config.via : dest;
  auto refuse = [&](ChannelErrc code, std::string why) {
    std::vector<internal::Outgoing> back;
    back.push_back({0, {}, std::move(env)});
    internal::hand_back(core, back, code, why);
  };
  if (env.parts.size() > std::min<size_t>(core.config.max_parts, wire::kMaxPartsLimit)) {
    return refuse(ChannelErrc::kFrameTooLarge,
                  "envelope for " + dest.to_string() + " has " + std::to_string(env.parts.size()) +
                      " parts, the limit is " + std::to_string(core.config.max_parts));
  }
  size_t header_bound = 0;
  if (size_t bound = wire::data_frame_bound(env, &header_bound);
      bound > core.config.max_frame_bytes) {
    return refuse(ChannelErrc::kFrameTooLarge,
                  "envelope for " + dest.to_string() + " of up to " + std::to_string(bound) +
                      " bytes exceeds max_frame_bytes " +
                      std::to_string(core.config.max_frame_bytes));
  }
  if (header_bound > core.config.max_header_bytes) {  // the receiver would refuse it (WI-5)
    return refuse(ChannelErrc::kFrameTooLarge,
                  "envelope for " + dest.to_string() + " has a header of up to " +
                      std::to_string(header_bound) + " bytes, over max_header_bytes " +
                      std::to_string(core.config.max_header_bytes));
  }
  if (!core.tls_error.empty() && to.transport == Transport::kTcp) {
    return refuse(ChannelErrc::kTlsFailed, "TLS to " + dest.to_string() + ": " + core.tls_error);
  }
  std::shared_ptr<internal::Link> link;           // held: forget() may drop it meanwhile
  std::shared_ptr<internal::Inbound> from_peer;  // CH-10
  {
    std::lock_guard lock(core.mu);
    if (!core.stopped) {
      if (auto it = core.inbound_by_peer.find(to); it != core.inbound_by_peer.end()) {
        from_peer = it->second.lock();
      }
      auto& slot = core.links[to];
      if (!slot) {
        if (to.transport == Transport::kInproc) {
          slot = std::make_shared<internal::InprocLink>(core_ptr, to);
        } else {
          slot = std::make_shared<internal::SocketLink>(core_ptr, to);
        }
      }
      link = slot;
    }
  }
  if (!link) return refuse(ChannelErrc::kCancelled, "net stopped");
  // CH-29: large parts for one receiver on this host go in shared blocks it maps.
  const auto& cfg = core.config;
  if (to.transport == Transport::kUnix && !env.fan_out && cfg.shared_part_min_bytes > 0 &&
      cfg.lend_min_bytes > 0) {
    internal::share_parts(env, std::max(cfg.shared_part_min_bytes, cfg.lend_min_bytes));
  }
  link->send(std::move(env));
  // CH-10: the peer hears from this Net now anyway, so what it sent here is acknowledged in
  // the same breath, not by a delayed-ack timer that would wake both ends again later.
  if (from_peer) from_peer->flush_ack();
}

void Net::stop() {
  Core& core = *impl_->core;
  std::vector<std::shared_ptr<internal::Link>> links;
  std::vector<std::shared_ptr<internal::ListenerBase>> listeners;
  std::unordered_set<std::shared_ptr<internal::Inbound>> inbounds;
  bool again;
  {
    std::lock_guard lock(core.mu);
    again = core.stopped;
    core.stopped = true;
    if (!again) {
      for (auto& [addr, link] : core.links) links.push_back(link);
      if (core.duplex) links.push_back(std::move(core.duplex));
      listeners.swap(core.listeners);
      inbounds.swap(core.inbounds);
      core.inbound_by_peer.clear();
      core.sessions.clear();
    }
  }
  // A second stop() (or ~Net after stop()) also waits: no callback may outlive it.
  core.gate.close_and_wait();
  if (again) return;
  for (auto& l : listeners) l->close();
  for (auto& in : inbounds) in->close("net stopped", internal::Core::Refusal::kNone);
  for (auto& link : links) link->stop();
  // CH-25: no pull of a lent part outlives stop(): what is left of them is cancelled.
  std::unique_lock lock(core.pull_mu);
  core.pulls_closed = true;
  core.pull_cancel->store(true, std::memory_order_relaxed);
  core.pull_cv.wait(lock, [&] { return core.pulls_in_flight == 0; });
}

void Net::start_via(std::function<void(Result<Address>)> event) {
  auto& core = impl_->core;
  if (!core->config.via) return;
  std::shared_ptr<internal::Link> duplex;
  {
    std::lock_guard lock(core->mu);
    if (core->stopped || core->duplex) return;
    core->via_event = std::move(event);
    duplex = core->duplex = std::make_shared<internal::SocketLink>(
        core, *core->config.via, internal::SocketLink::Mode::kDuplex, *core->config.via);
  }
  duplex->start();
}

void Net::serve_as_gateway(const Address& self) {
  std::lock_guard lock(impl_->core->mu);
  impl_->core->gateway = self;
}

void Net::forget(const Address& peer, const std::string& why) {
  Core& core = *impl_->core;
  std::shared_ptr<internal::Link> link;
  {
    std::lock_guard lock(core.mu);
    if (core.stopped) return;  // stop() has them all
    auto it = core.links.find(peer);
    if (it == core.links.end()) return;
    link = std::move(it->second);
    core.links.erase(it);
  }
  link->stop(why);
}

size_t Net::link_count() const {
  std::lock_guard lock(impl_->core->mu);
  return impl_->core->links.size();
}

size_t Net::unacknowledged(const Address& to) const {
  std::shared_ptr<internal::Link> link;
  {
    std::lock_guard lock(impl_->core->mu);  // not held while the link's mutex is (lock order)
    auto it = impl_->core->links.find(to);
    if (it == impl_->core->links.end()) return 0;
    link = it->second;
  }
  return link->unacknowledged();
}

void Net::reset_connections_for_test() {
  Core& core = *impl_->core;
  std::vector<std::shared_ptr<internal::Link>> links;
  std::vector<std::shared_ptr<internal::Inbound>> inbounds;
  {
    std::lock_guard lock(core.mu);
    for (auto& [addr, link] : core.links) links.push_back(link);
    if (core.duplex) links.push_back(core.duplex);
    inbounds.assign(core.inbounds.begin(), core.inbounds.end());
  }
  for (auto& link : links) link->reset_for_test();
  for (auto& in : inbounds) in->close("connection reset for test", internal::Core::Refusal::kNone);
}

void Net::on_batch_end(std::function<void()> fn) { impl_->core->batch_end = std::move(fn); }

Result<PortReservation> PortReservation::make(const std::string& host) {
  auto fail = [&](std::string_view step, int err) {
    return std::unexpected(make_error(ChannelErrc::kListenFailed,
                                      "reserve a TCP port on " + host + ": " + std::string(step) +
                                          ": " + std::error_code(err, std::system_category()).message()));
  };
  auto eps = internal::resolve_tcp(host, 0);
  if (!eps) return std::unexpected(eps.error());
  const auto& ep = eps->front();
  int fd = ::socket(ep.data()->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail("socket", errno);
  PortReservation r(fd, 0);  // closes fd on every path out
  int one = 1;
  if (::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) {
    return fail("SO_REUSEPORT", errno);
  }
  // Not SO_REUSEADDR: with it, any listener that sets it (as podium's do) could take the port.
  if (::bind(fd, ep.data(), static_cast<socklen_t>(ep.size())) != 0) return fail("bind", errno);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return fail("getsockname", errno);
  }
  r.port_ = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                     : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return r;
}

PortReservation::PortReservation(PortReservation&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), port_(other.port_) {}

PortReservation& PortReservation::operator=(PortReservation&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    port_ = other.port_;
  }
  return *this;
}

PortReservation::~PortReservation() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace podium::channel
