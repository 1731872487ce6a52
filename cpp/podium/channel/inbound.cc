#include "podium/channel/inbound.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <asio/post.hpp>

namespace podium::channel::internal {
namespace {

// The port of a bound IPv4 or IPv6 socket address, in host order.
uint16_t port_of(const sockaddr* sa) {
  return ntohs(sa->sa_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port
                                         : reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
}

using R = Core::Refusal;

// CH-15: which counter a frame decoder's error bumps.
R refusal_of(const Error& e) {
  return e.is(wire::WireErrc::kFrameTooLarge) || e.is(wire::WireErrc::kTooManyParts) ||
                 e.is(wire::WireErrc::kHeaderTooLarge)
             ? R::kOversize
             : R::kMalformed;
}

std::shared_ptr<Session> attach_session(Core& core, uint64_t id) {
  std::lock_guard lock(core.mu);
  // Sessions arrive only with a Hello, so sweeping here bounds the table.
  auto now = core.now();
  auto linger = 2 * core.config.delivery_timeout;
  std::erase_if(core.sessions, [&](const auto& kv) {
    return kv.second->connections == 0 && now - kv.second->idle_since > linger;
  });
  auto& s = core.sessions[id];
  if (!s) s = std::make_shared<Session>(id);
  ++s->connections;
  return s;
}

}  // namespace

// ---- Inbound ----

Inbound::Inbound(std::shared_ptr<Core> core, Socket socket, Transport transport, std::string local)
    : core_(std::move(core)),
      local_(std::move(local)),
      peer_(peer_name(socket, transport)),
      decoder_(wire::FrameLimits{core_->config.max_frame_bytes, core_->config.max_parts,
                                 core_->config.max_header_bytes}),
      socket_(std::move(socket)),
      ack_timer_(core_->io, core_->config.clock),
      transport_(transport),
      auth_timer_(core_->io, core_->config.clock) {
  configure_stream(socket_, transport);
}

Inbound::Inbound(std::shared_ptr<Core> core, Socket socket, Transport transport,
                 std::string local, std::shared_ptr<std::atomic<uint32_t>> unauthenticated)
    : Inbound(std::move(core), std::move(socket), transport, std::move(local)) {
  unauthenticated_ = std::move(unauthenticated);
}

Inbound::Inbound(std::shared_ptr<Core> core, Socket socket, Transport transport,
                 std::string local, std::unique_ptr<TlsSession> tls,
                 std::function<void(const std::string&)> on_close)
    : Inbound(std::move(core), std::move(socket), transport, std::move(local)) {
  lent_ = true;
  tls_ = std::move(tls);
  on_close_ = std::move(on_close);
}

Inbound::~Inbound() {
  if (unauthenticated_) unauthenticated_->fetch_sub(1, std::memory_order_relaxed);
  if (!session_) return;
  std::lock_guard lock(core_->mu);
  if (--session_->connections == 0) session_->idle_since = core_->now();
}

void Inbound::start() {
  std::lock_guard lock(mu_);
  if (closed_) return;
  // CH-13: every connection, whatever its transport, finishes its handshake (TLS, secret,
  // Hello) within the deadline or goes.
  auth_timer_.expires_after(core_->config.handshake_timeout);
  auth_timer_.async_wait([self = shared_from_this()](const std::error_code& ec) {
    if (!ec) self->on_handshake_timeout();
  });
  if (lent_) {
    // GW-1: the link that lends the socket ran the setup; the gateway's Hello comes next.
    authenticated_ = true;
    if (tls_ && tls_->input_buffered()) {
      asio::post(core_->io, [self = shared_from_this()] { self->on_read({}, 0); });
    } else {
      arm_read_locked(ReadFor::kFrames);
    }
  } else if (transport_ == Transport::kTcp &&
             (core_->tls_enabled() || !core_->config.secret.empty())) {
    start_setup_locked();
  } else {
    arm_read_locked(ReadFor::kFrames);
  }
}

// ---- Inbound: the setup (CH-8, CH-9; the state machine is tls_setup.cc's) ----

void Inbound::start_setup_locked() {
  if (core_->tls_enabled()) {
    if (!core_->tls) {
      close_locked("refused: " + core_->tls_error, R::kAuth);
      return;
    }
    auto session = TlsSession::make(*core_->tls, TlsSession::Role::kListener);
    if (!session) {
      close_locked("refused: " + session.error().message, R::kAuth);
      return;
    }
    tls_ = std::move(*session);
  }
  setup_.emplace(TlsSetup::Role::kListener, tls_.get(), core_->config.secret, peer_);
  after_setup_locked(setup_->start(socket_.native_handle()));
}

void Inbound::on_setup_input(const std::error_code& ec, size_t n) {
  std::lock_guard lock(mu_);
  if (closed_ || !setup_) return;
  if (ec) {
    if (ec == asio::error::operation_aborted) return;
    after_setup_locked(setup_->read_failed(ec == asio::error::eof, ec.message()));
    return;
  }
  after_setup_locked(setup_->input(socket_.native_handle(), n));
}

void Inbound::after_setup_locked(TlsSetup::Status status) {
  if (status == TlsSetup::Status::kFailed) {
    using F = TlsSetup::Failure;
    F kind = setup_->failure();
    std::string why = setup_->why();
    setup_.reset();
    close_locked(why, kind == F::kWrite ? R::kNone : kind == F::kLocal ? R::kLocal : R::kAuth);
    return;
  }
  // Ciphertext the socket did not take: on_writable() flushes it.
  if (tls_ && tls_->output_pending() && !write_waiting_) {
    write_waiting_ = true;
    socket_.async_wait(Socket::wait_write, [self = shared_from_this()](const std::error_code& ec) {
      self->on_writable(ec);
    });
  }
  if (status == TlsSetup::Status::kWantInput) {
    arm_read_locked(ReadFor::kSetup);
    return;
  }
  setup_.reset();
  authenticated_ = true;
  if (tls_ && tls_->input_buffered()) {
    // Bytes that came with the end of the setup: decode them before reading more.
    asio::post(core_->io, [self = shared_from_this()] { self->on_read({}, 0); });
  } else {
    arm_read_locked(ReadFor::kFrames);
  }
}

void Inbound::on_handshake_timeout() {
  std::lock_guard lock(mu_);
  if (closed_ || session_) return;
  auto ms = std::to_string(core_->config.handshake_timeout.count()) + " ms";
  close_locked(setup_ && setup_->in_tls_handshake()
                   ? "refused: the TLS setup did not finish within " + ms
               : !authenticated_ && transport_ == Transport::kTcp &&
                       !core_->config.secret.empty()
                   ? "refused: no answer to the authentication challenge within " + ms
                   : "refused: no Hello within " + ms + " of connecting",
               R::kTimeout);
}

bool Inbound::evict_if_unproven(const std::string& why) {
  std::lock_guard lock(mu_);
  if (closed_ || authenticated_ || session_ || !unauthenticated_) return false;
  close_locked(why, R::kNone);  // the listener counts it and warns, rate-limited
  return true;
}

bool Inbound::unproven() {
  std::lock_guard lock(mu_);
  return !closed_ && !authenticated_ && !session_ && unauthenticated_ != nullptr;
}

void Inbound::release_unauthenticated_locked() {
  if (auto slot = std::exchange(unauthenticated_, nullptr)) {
    slot->fetch_sub(1, std::memory_order_relaxed);
  }
}

void Inbound::close(const std::string& why, Core::Refusal refusal) {
  std::lock_guard lock(mu_);
  close_locked(why, refusal);
}

void Inbound::close_locked(const std::string& why, Core::Refusal refusal) {
  if (closed_) return;
  closed_ = true;
  core_->count(refusal);  // before the peer can see the close
  std::error_code ec;
  socket_.close(ec);
  ack_timer_.cancel();
  auth_timer_.cancel();
  release_unauthenticated_locked();
  if (auto f = std::exchange(on_close_, nullptr)) {
    asio::post(core_->io, [f = std::move(f), why] { f(why); });
  }
  std::string from = hello_from_.empty() ? peer_ : peer_ + " (" + hello_from_ + ")";
  if (refusal != R::kNone) {
    // CH-5's warning, at most a few per second per kind under a flood (BL-2).
    core_->warnings(refusal).warn("channel: closing connection from {} to {}: {}", from, local_,
                                  why);
  } else {
    spdlog::debug("channel: closing connection from {} to {}: {}", from, local_, why);
  }
  decltype(core_->inbounds)::node_type node;  // destroyed after the lock is released
  std::lock_guard lock(core_->mu);
  node = core_->inbounds.extract(shared_from_this());
  if (listed_as_) {
    auto it = core_->inbound_by_peer.find(*listed_as_);
    if (it != core_->inbound_by_peer.end() && it->second.lock().get() == this) {
      core_->inbound_by_peer.erase(it);
    }
  }
}

// One socket read, the only place a read is armed (D11): where the setup says while it runs
// (tls_setup.h), then into the TLS session's input when TLS is on, else into the frame
// decoder; its completion goes to the setup or to on_read.
void Inbound::arm_read_locked(ReadFor what) {
  auto into = what == ReadFor::kSetup ? setup_->input_space()
              : tls_                  ? tls_->input_space()
                                      : decoder_.prepare();
  if (into.empty()) {  // a TLS input ring that a partial record cannot fill
    close_locked("TLS: protocol error: input buffer full", R::kMalformed);
    return;
  }
  read_into_ = into.data();
  socket_.async_read_some(asio::buffer(into.data(), into.size()),
                          [self = shared_from_this(), what](const std::error_code& ec, size_t n) {
                            if (what == ReadFor::kSetup) {
                              self->on_setup_input(ec, n);
                            } else {
                              self->on_read(ec, n);
                            }
                          });
}

void Inbound::on_read(const std::error_code& ec, size_t n) {
  if (ec) {
    if (ec == asio::error::operation_aborted) return;  // closed by us
    bool truncated = decoder_.mid_frame();
    if (ec == asio::error::eof) {
      close(truncated ? "connection closed inside a frame (truncated frame)" : "closed by peer",
            truncated ? R::kMalformed : R::kNone);
    } else {
      // A reset inside a frame is a truncated frame too.
      close("read: " + ec.message() + (truncated ? " (inside a frame: truncated frame)" : ""),
            truncated ? R::kMalformed : R::kNone);
    }
    return;
  }
  if (!tls_ && std::exchange(first_read_, false) && looks_like_tls({read_into_, n})) {
    // A TLS dialler (CH-9), and this Net has no TLS: say so, then go.
    auto notice = plaintext_notice();
    iovec v{notice.data(), notice.size()};
    std::lock_guard lock(mu_);
    (void)send_iov(socket_.native_handle(), &v, 1);
    close_locked("refused: the peer speaks TLS, and this listener has no TLS configured",
                 R::kAuth);
    return;
  }
  Gate::Scope gate(core_->gate);
  if (!gate) {
    close("net stopped", R::kNone);
    return;
  }
  BatchEnd batch{*core_};  // after every lock below is released
  {
    // Taken at the first Data of this read and held for the rest of its frames.
    std::unique_lock<std::mutex> delivering;
    if (tls_) {
      tls_->commit_input(n);
      for (;;) {
        auto r = tls_->read(decoder_.prepare());
        if (r.n > 0) {
          decoder_.commit(r.n);
          // TLS runs only on TCP, where nothing is lent (CH-25): never kPulling.
          if (deliver_frames(batch, delivering) != Frames::kDone) return;
        }
        if (r.failed) {
          close("TLS: " + tls_->error(), R::kMalformed);
          return;
        }
        if (r.closed) {
          bool truncated = decoder_.mid_frame();
          close(truncated ? "connection closed inside a frame (truncated frame)"
                          : "closed by peer",
                truncated ? R::kMalformed : R::kNone);
          return;
        }
        if (r.n == 0) break;
      }
    } else {
      decoder_.commit(n);
      if (deliver_frames(batch, delivering) != Frames::kDone) return;
    }
  }
  after_frames();
}

void Inbound::after_frames() {
  std::lock_guard lock(mu_);
  if (closed_) return;
  if (session_) {
    uint64_t unacked = session_->delivered.load(std::memory_order_acquire) - acked_;
    if (unacked > 0 && unacked_since_ == Clock::time_point{}) unacked_since_ = core_->now();
    if (unacked >= core_->config.ack_every) {
      ack_locked();
    } else if (unacked > 0 && !ack_armed_) {
      ack_armed_ = true;
      ack_timer_.expires_after(core_->config.ack_delay);
      ack_timer_.async_wait(
          [self = shared_from_this()](const std::error_code& ec) { self->on_ack_timer(ec); });
    }
  }
  if (!closed_) arm_read_locked(ReadFor::kFrames);
}

void Inbound::deliver_data(wire::Data& d, BatchEnd& batch) {
  session_->delivered.store(d.seq, std::memory_order_release);
  if (forward_to_) {  // GW-2: a gateway passes it on, from its own Net
    net_send(core_, *forward_to_, std::move(d.envelope));
    return;
  }
  if (gateway_ && !d.envelope.headers.empty() &&
      d.envelope.headers.back().first == kViaToHeader) {
    forward_wrapped(std::move(d.envelope));  // GW-3
    return;
  }
  batch.delivered = true;
  core_->deliver(std::move(d.envelope));
}

Inbound::Frames Inbound::deliver_frames(BatchEnd& batch,
                                        std::unique_lock<std::mutex>& delivering) {
  wire::RawFrame frame;
  for (;;) {
    auto ready = decoder_.next(frame);
    if (!ready) {
      close(ready.error().message, refusal_of(ready.error()));
      return Frames::kClosed;
    }
    if (!*ready) return Frames::kDone;
    auto m = wire::decode(std::move(frame));
    if (!m) {
      close(m.error().message, R::kMalformed);
      return Frames::kClosed;
    }
    if (auto* d = std::get_if<wire::Data>(&*m)) {
      if (!session_) {
        close("Data before Hello", R::kMalformed);
        return Frames::kClosed;
      }
      if (!d->lent.empty() && pull_pid_ == 0) {
        close("protocol error: lent parts on a connection that does not pull them",
              R::kMalformed);
        return Frames::kClosed;
      }
      if (!d->lent.empty() && !lent_fit(*d)) return Frames::kClosed;  // CH-15
      if (!delivering) delivering = std::unique_lock(session_->mu);
      if (d->seq <= session_->delivered.load(std::memory_order_relaxed)) continue;  // resent
      if (core_->gate.closed()) {  // stop() is waiting for this read to finish
        close("net stopped", R::kNone);
        return Frames::kClosed;
      }
      if (!d->lent.empty()) return start_pull(std::move(*d));  // CH-25
      deliver_data(*d, batch);
    } else if (auto* hello = std::get_if<wire::Hello>(&*m)) {
      if (!accept_hello(*hello)) return Frames::kClosed;
    } else {
      close("protocol error: Ack or HelloAck sent to a listener", R::kMalformed);
      return Frames::kClosed;
    }
  }
}

bool Inbound::accept_hello(const wire::Hello& hello) {
  if (session_) {
    close("protocol error: second Hello", R::kMalformed);
    return false;
  }
  if (hello.protocol_version != wire::kSessionProtocolVersion) {
    close("session protocol version " + std::to_string(hello.protocol_version) +
              ", this build speaks " + std::to_string(wire::kSessionProtocolVersion),
          R::kMalformed);
    return false;
  }
  if (hello.flags & wire::kHelloReverse) return accept_duplex(hello);
  std::optional<Address> forward;
  if (!hello.to.empty() && !(lent_ ? duplex_opened(hello) : route_of(hello, forward))) {
    return false;
  }
  forward_to_ = std::move(forward);
  uint32_t ack_flags = probe_lender(hello) ? wire::kAckPull : 0;  // CH-25
  auto session = attach_session(*core_, hello.session_id);
  std::lock_guard lock(mu_);
  session_ = std::move(session);  // ~Inbound releases it even if closed meanwhile
  if (closed_) return false;
  // The handshake is complete: the deadline and the slot under the cap go (CH-13, CH-14).
  auth_timer_.cancel();
  release_unauthenticated_locked();
  hello_from_ = hello.listen_address;
  {
    std::lock_guard core_lock(core_->mu);
    gateway_ = core_->gateway.has_value();
  }
  if (auto from = Address::parse(hello.listen_address)) {
    std::lock_guard core_lock(core_->mu);
    if (!core_->stopped) {
      core_->inbound_by_peer[*from] = weak_from_this();
      listed_as_ = std::move(*from);
    }
  }
  acked_ = session_->delivered.load(std::memory_order_acquire);
  wire::encode(wire::HelloAck{acked_, ack_flags}, out_);
  write_locked();
  return !closed_;
}

void Inbound::ack_locked() {
  if (out_off_ < out_.size()) return;  // a frame is still going out; on_writable re-checks
  uint64_t delivered = session_->delivered.load(std::memory_order_acquire);
  if (delivered <= acked_) return;
  out_.clear();
  out_off_ = 0;
  wire::encode(wire::Ack{delivered}, out_);
  acked_ = delivered;
  unacked_since_ = {};
  write_locked();
}

void Inbound::write_locked() {
  iovec v{out_.data() + out_off_, out_.size() - out_off_};
  ssize_t n = tls_ ? tls_->write(socket_.native_handle(), &v, 1)
                   : send_iov(socket_.native_handle(), &v, 1);
  if (n < 0) {
    close_locked(tls_ && n == -EPROTO ? "TLS: " + tls_->error()
                                      : errno_error("write", int(-n)).message, R::kNone);
    return;
  }
  out_off_ += size_t(n);
  // The socket buffer is full (or, with TLS, holds back ciphertext): finish on the io_context.
  if ((out_off_ < out_.size() || (tls_ && tls_->output_pending())) && !write_waiting_) {
    write_waiting_ = true;
    socket_.async_wait(Socket::wait_write, [self = shared_from_this()](const std::error_code& ec) {
      self->on_writable(ec);
    });
  }
}

void Inbound::on_writable(const std::error_code& ec) {
  std::lock_guard lock(mu_);
  write_waiting_ = false;
  if (closed_) return;
  if (ec) {
    close_locked("write: " + ec.message(), R::kNone);
    return;
  }
  write_locked();
  if (!closed_ && session_ && out_off_ == out_.size()) ack_locked();
}

void Inbound::flush_ack() {
  std::lock_guard lock(mu_);
  if (closed_ || !session_) return;
  if (session_->delivered.load(std::memory_order_acquire) <= acked_) return;
  // A fast exchange keeps its acks batched: what arrived within ack_with_send_after waits
  // for a later send, ack_every or the timer (CH-10).
  if (core_->now() - unacked_since_ < core_->config.ack_with_send_after) return;
  ack_locked();
  // A timer left armed would wake this proc later for nothing.
  if (ack_armed_ && acked_ >= session_->delivered.load(std::memory_order_acquire)) {
    ack_armed_ = false;
    ack_timer_.cancel();  // its handler sees operation_aborted
  }
}

void Inbound::on_ack_timer(const std::error_code& ec) {
  if (ec) return;
  std::lock_guard lock(mu_);
  ack_armed_ = false;
  if (!closed_ && session_) ack_locked();
}

// ---- SocketListener ----

SocketListener::SocketListener(std::shared_ptr<Core> core, Address addr)
    : core_(std::move(core)),
      bound_(std::move(addr)),
      acceptor_(core_->io),
      retry_(core_->io, core_->config.clock) {}

Result<std::shared_ptr<SocketListener>> SocketListener::listen(std::shared_ptr<Core> core,
                                                               const Address& addr, int fd) {
  std::string text = addr.to_string() + (fd >= 0 ? " (descriptor " + std::to_string(fd) + ")" : "");
  auto fail = [&](std::string_view step, const std::error_code& ec) {
    return std::unexpected(make_error(ChannelErrc::kListenFailed,
                                      "listen on " + text + ": " + std::string(step) + ": " +
                                          ec.message()));
  };
  Endpoint ep;
  if (fd >= 0) {
    // An inherited listening TCP socket: its family from getsockname; it stays listening.
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int type = 0, listening = 0;
    socklen_t tl = sizeof type, ll = sizeof listening;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 ||
        ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 ||
        ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ll) != 0) {
      return fail("adopt", std::error_code(errno, std::system_category()));
    }
    if ((ss.ss_family != AF_INET && ss.ss_family != AF_INET6) || type != SOCK_STREAM) {
      return fail("adopt", std::make_error_code(std::errc::not_a_socket));
    }
    std::shared_ptr<SocketListener> l(new SocketListener(std::move(core), addr));
    std::error_code ec;
    asio::generic::stream_protocol proto(ss.ss_family, IPPROTO_TCP);
    l->acceptor_.assign(proto, fd, ec);
    if (ec) return fail("adopt", ec);
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);  // procs must not inherit it
    if (!listening) {
      l->acceptor_.listen(asio::socket_base::max_listen_connections, ec);
      if (ec) {
        l->close();
        return fail("listen", ec);
      }
    }
    l->bound_.port = port_of(reinterpret_cast<const sockaddr*>(&ss));
    l->bound_text_ = l->bound_.to_string();
    std::lock_guard lock(l->mu_);
    l->accept_locked();
    return l;
  }
  if (addr.transport == Transport::kUnix) {
    if (auto s = prepare_unix_path(addr.target); !s) return std::unexpected(s.error());
    ep = unix_endpoint(addr.target);
  } else {
    auto eps = resolve_tcp(addr.target, addr.port);
    if (!eps) return std::unexpected(eps.error());
    ep = eps->front();
  }
  bool reuse_port = core->config.reuse_port;
  std::shared_ptr<SocketListener> l(new SocketListener(std::move(core), addr));
  std::error_code ec;
  l->acceptor_.open(ep.protocol(), ec);
  if (ec) return fail("socket", ec);
  if (addr.transport == Transport::kTcp) {
    l->acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (reuse_port) {
      int one = 1;
      if (::setsockopt(l->acceptor_.native_handle(), SOL_SOCKET, SO_REUSEPORT, &one,
                       sizeof one) != 0) {
        return fail("SO_REUSEPORT", std::error_code(errno, std::system_category()));
      }
    }
  }
  l->acceptor_.bind(ep, ec);
  if (ec) return fail("bind", ec);
  if (addr.transport == Transport::kUnix && !addr.target.starts_with('@')) {
    struct stat st;
    // Only the owner may connect; the directory should already keep others out.
    if (::chmod(addr.target.c_str(), 0600) != 0 || ::stat(addr.target.c_str(), &st) != 0) {
      int err = errno;
      ::unlink(addr.target.c_str());
      return fail("chmod", std::error_code(err, std::system_category()));
    }
    l->path_ = addr.target;
    l->dev_ = st.st_dev;
    l->ino_ = st.st_ino;
  }
  l->acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    l->close();
    return fail("listen", ec);
  }
  if (addr.transport == Transport::kTcp) {
    Endpoint local = l->acceptor_.local_endpoint(ec);
    if (ec) return fail("getsockname", ec);
    l->bound_.port = port_of(static_cast<const sockaddr*>(local.data()));
  }
  l->bound_text_ = l->bound_.to_string();
  std::lock_guard lock(l->mu_);
  l->accept_locked();
  return l;
}

void SocketListener::close() {
  std::lock_guard lock(mu_);
  if (closed_) return;
  closed_ = true;
  std::error_code ec;
  acceptor_.close(ec);
  retry_.cancel();
  struct stat st;
  if (!path_.empty() && ::stat(path_.c_str(), &st) == 0 && uint64_t(st.st_dev) == dev_ &&
      uint64_t(st.st_ino) == ino_) {
    ::unlink(path_.c_str());
  }
}

void SocketListener::accept_locked() {
  acceptor_.async_accept([self = shared_from_this()](const std::error_code& ec, Socket s) {
    self->on_accept(ec, std::move(s));
  });
}

void SocketListener::on_accept(const std::error_code& ec, Socket socket) {
  std::lock_guard lock(mu_);
  if (closed_ || ec == asio::error::operation_aborted) return;
  if (ec) {
    // EMFILE and the like: the loop waits, then accepts again; it never stops (CH-14).
    core_->accept_warnings.warn("channel: accept on {}: {}; retrying in 100 ms", bound_text_,
                                ec.message());
    retry_.expires_after(std::chrono::milliseconds(100));
    retry_.async_wait([self = shared_from_this()](const std::error_code& ec) {
      std::lock_guard lock(self->mu_);
      if (!ec && !self->closed_) self->accept_locked();
    });
    return;
  }
  // CH-16: a Unix socket's peer runs as this user (or root). A socket file is 0600 in a 0700
  // directory, but an abstract name (unix:@NAME) has no permissions at all.
  if (bound_.transport == Transport::kUnix) {
    ucred cred{};
    socklen_t len = sizeof cred;
    bool ok = ::getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
    if (!ok || (cred.uid != ::geteuid() && cred.uid != 0)) {
      core_->count(R::kAuth);
      std::string peer = peer_name(socket, bound_.transport);
      std::error_code ignored;
      socket.close(ignored);
      core_->warnings(R::kAuth).warn(
          "channel: closing connection from {} to {}: refused: the peer runs as uid {}, this "
          "process as uid {}",
          peer, bound_text_, ok ? std::to_string(cred.uid) : "unknown", ::geteuid());
      accept_locked();
      return;
    }
  }
  // CH-14: at the cap of connections mid-handshake, the oldest that has proved nothing yet
  // is closed to make room: a flood of silent connections cannot keep a real peer out, which
  // proves the secret within a round trip of connecting. When every one of them has proved
  // something, the new connection is closed at once, before anything is allocated for it.
  const auto cap = core_->config.max_unauthenticated;
  if (unauthenticated_->load(std::memory_order_relaxed) >= cap) {
    core_->counters.unauthenticated_cap_hits.fetch_add(1, std::memory_order_relaxed);
    bool made_room = false;
    while (!made_room && !pending_.empty()) {
      auto oldest = pending_.front().lock();
      pending_.pop_front();
      made_room = oldest && oldest->evict_if_unproven(
                                "refused: it had proved nothing when a newer connection needed its "
                                "place (max_unauthenticated)");
    }
    if (!made_room) {
      std::error_code ignored;
      std::string peer = peer_name(socket, bound_.transport);
      socket.close(ignored);
      core_->cap_warnings.warn(
          "channel: closing connection from {} to {}: refused: {} connections are already "
          "mid-handshake (max_unauthenticated)",
          peer, bound_text_, cap);
      accept_locked();
      return;
    }
    core_->cap_warnings.warn(
        "channel: {} connections on {} are mid-handshake (max_unauthenticated): closed the "
        "oldest that had proved nothing, for a new connection from {}",
        cap, bound_text_, peer_name(socket, bound_.transport));
  }
  unauthenticated_->fetch_add(1, std::memory_order_relaxed);
  auto in = std::make_shared<Inbound>(core_, std::move(socket), bound_.transport, bound_text_,
                                      unauthenticated_);
  if (pending_.size() >= 2 * size_t{cap} + 16) {
    std::erase_if(pending_, [](const std::weak_ptr<Inbound>& w) {
      auto p = w.lock();
      return !p || !p->unproven();
    });
  }
  pending_.push_back(in);
  bool stopped;
  {
    std::lock_guard core_lock(core_->mu);
    stopped = core_->stopped;
    if (!stopped) core_->inbounds.insert(in);
  }
  if (stopped) {
    in->close("net stopped", R::kNone);
    return;
  }
  in->start();
  accept_locked();
}

}  // namespace podium::channel::internal
