// Gateways (GW-1..GW-4, net.h; docs/channel.md "Gateways"): a client that procs cannot reach
// keeps one duplex to a gateway Net it can reach; the gateway sends the client's traffic on
// and routes the procs' answers back over that duplex.
//
// Here: the client's side of the duplex (SocketLink::lend_locked, lent_closed), the gateway's
// link that sends on it (SocketLink::adopt), and the gateway's routing of what arrives
// (Inbound::route_of, accept_duplex; the client's Inbound::duplex_opened).
//
// Threads: as link.h and inbound.h. The client's duplex holds its link's mutex while it
// starts the Inbound it lends the socket to (link -> connection); no Inbound mutex is held
// while a link's is taken: the gateway hands the socket over after releasing the
// connection's, and the lent Inbound reports its close through a posted handler.
#include <spdlog/spdlog.h>

#include <asio/post.hpp>

#include "podium/channel/inbound.h"
#include "podium/channel/link.h"
#include "podium/wire/message.h"

namespace podium::channel::internal {

// ---- the client ----

void SocketLink::lend_locked() {
  wire::Hello hello;
  hello.flags = wire::kHelloReverse;
  {
    std::lock_guard core_lock(core_->mu);
    // The routed address once a gateway named one: a re-dialled duplex keeps its identity.
    hello.listen_address = core_->self_address;
  }
  std::vector<std::byte> bytes;
  wire::encode(hello, bytes);
  iovec v{bytes.data(), bytes.size()};
  int fd = socket_.native_handle();
  ssize_t n = tls_ ? tls_->write(fd, &v, 1) : send_iov(fd, &v, 1);
  if (n == ssize_t(bytes.size()) && tls_ && (tls_->flush(fd) < 0 || tls_->output_pending())) {
    n = -1;
  }
  if (n != ssize_t(bytes.size())) {
    // A fresh connection takes a few dozen bytes at once; one that does not is broken.
    failed_locked("duplex to the gateway " + to_text_ + ": the reverse Hello did not go out");
    return;
  }
  ++gen_;  // nothing of this connection runs on the link any more
  write_waiting_ = false;
  auto gen = gen_;
  std::weak_ptr<SocketLink> weak = std::static_pointer_cast<SocketLink>(shared_from_this());
  auto in = std::make_shared<Inbound>(
      core_, std::move(socket_), dial_.transport, "the duplex to " + to_text_, std::move(tls_),
      [weak, gen](const std::string& why) {
        if (auto link = weak.lock()) link->lent_closed(gen, why);
      });
  socket_ = Socket(core_->io);
  bool stopped;
  {
    std::lock_guard core_lock(core_->mu);
    stopped = core_->stopped;
    if (!stopped) core_->inbounds.insert(in);  // stop() closes it
  }
  if (stopped) {
    in->close("net stopped", Core::Refusal::kNone);
    return;
  }
  in->start();
}

void SocketLink::lent_closed(uint64_t gen, const std::string& why) {
  std::lock_guard lock(mu_);
  if (gen != gen_ || state_ != State::kConnected) return;
  failed_locked("the duplex to the gateway " + to_text_ + " closed: " + why);  // re-dials
}

bool Inbound::duplex_opened(const wire::Hello& hello) {
  auto routed = Address::parse(hello.to);
  if (!routed) {
    close("the gateway named a bad routed address: " + routed.error().message,
          Core::Refusal::kMalformed);
    return false;
  }
  std::function<void(Result<Address>)> event;
  {
    std::lock_guard lock(core_->mu);
    core_->self_address = hello.to;
    event = core_->via_event;
  }
  if (event) event(*routed);
  return true;
}

// ---- the gateway ----

void SocketLink::adopt(Socket socket, std::unique_ptr<TlsSession> tls) {
  std::lock_guard lock(mu_);
  if (state_ == State::kStopped) {
    std::error_code ec;
    socket.close(ec);
    return;
  }
  close_locked();  // an older duplex of this client, if the gateway had not seen it break
  socket_ = std::move(socket);
  tls_ = std::move(tls);
  state_ = State::kConnected;
  last_error_.clear();
  reset_backoff_locked();
  start_session_locked();  // Hello; a resumed session waits for HelloAck (CH-2)
}

bool Inbound::route_of(const wire::Hello& hello, std::optional<Address>& out) {
  std::optional<Address> gateway;
  std::string self;
  {
    std::lock_guard lock(core_->mu);
    gateway = core_->gateway;
    self = core_->self_address;
  }
  if (!gateway) return true;  // a proc: the address is its own (AC-14 judges it)
  auto to = Address::parse(hello.to);
  if (!to) {
    close("a Hello for a bad address: " + to.error().message, Core::Refusal::kMalformed);
    return false;
  }
  // This gateway's own forward that came back to it (an address of its port that names no
  // client): delivered here, where the proc layer refuses it, instead of going round again.
  if (hello.listen_address == self) return true;
  if (to->transport != Transport::kTcp) {
    // GW-4: a Unix socket on this host proves nothing of its peer (CH-16 trusts the user),
    // so a remote peer must not reach one through the gateway (another job's procs).
    close("refused: a gateway forwards to TCP addresses only, not " + hello.to,
          Core::Refusal::kAuth);
    return false;
  }
  bool routed;
  {
    std::lock_guard lock(core_->mu);
    routed = core_->routed.contains(*to);
  }
  bool here = to->transport == gateway->transport && to->target == gateway->target &&
              to->port == gateway->port;
  if (routed || !here) out = std::move(*to);
  return true;
}

void Inbound::forward_wrapped(wire::Envelope&& env) {
  std::string text = std::move(env.headers.back().second);
  env.headers.pop_back();
  auto to = Address::parse(text);
  if (!to || to->transport != Transport::kTcp) {
    // GW-4: a Unix socket on this host trusts any process of its user (another job's too).
    core_->undeliverable(std::move(env),
                         make_error(ChannelErrc::kProtocol,
                                    "the gateway " + local_ +
                                        " forwards to TCP addresses only, not " + text));
    return;
  }
  net_send(core_, *to, std::move(env));
}

bool Inbound::accept_duplex(const wire::Hello& hello) {
  std::optional<Address> gateway;
  {
    std::lock_guard lock(core_->mu);
    gateway = core_->gateway;
  }
  if (!gateway) {
    close("refused: a client's duplex (attach), and this process is no gateway",
          Core::Refusal::kMalformed);
    return false;
  }
  Address routed = *gateway;
  if (hello.listen_address.empty()) {
    routed.incarnation = new_incarnation();
  } else {
    auto claimed = Address::parse(hello.listen_address);
    if (!claimed || claimed->incarnation == 0 || claimed->transport != gateway->transport ||
        claimed->target != gateway->target || claimed->port != gateway->port) {
      close("refused: a duplex may claim only an address of this gateway (" +
                gateway->to_string() + " with an incarnation), not " + hello.listen_address,
            Core::Refusal::kAuth);
      return false;
    }
    routed = *claimed;  // a client re-dialling keeps its identity
  }
  Socket socket(core_->io);
  std::unique_ptr<TlsSession> tls;
  {
    std::lock_guard lock(mu_);
    if (closed_) return false;
    closed_ = true;  // handed over: nothing of this connection runs here any more
    auth_timer_.cancel();
    ack_timer_.cancel();
    release_unauthenticated_locked();
    socket = std::move(socket_);
    tls = std::move(tls_);
  }
  std::shared_ptr<Link> link, replaced;
  {
    std::lock_guard lock(core_->mu);
    core_->inbounds.erase(shared_from_this());
    if (!core_->stopped) {
      auto& slot = core_->links[routed];
      if (!slot || !core_->routed.contains(routed)) {
        replaced = std::move(slot);  // a link made before the client attached (GW-4)
        slot = std::make_shared<SocketLink>(core_, routed, SocketLink::Mode::kAdopted);
      }
      link = slot;
      core_->routed.insert(routed);
    }
  }
  if (replaced) replaced->stop("a client attached at " + routed.to_string());
  if (!link) {
    std::error_code ec;
    socket.close(ec);
    return false;
  }
  spdlog::debug("channel: gateway {}: client {} attached as {}", local_, peer_,
                routed.to_string());
  std::static_pointer_cast<SocketLink>(link)->adopt(std::move(socket), std::move(tls));
  return false;  // this read chain ends
}

}  // namespace podium::channel::internal
