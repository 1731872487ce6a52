// SocketLink's setup, the dialler's side of CH-8 and CH-9: it makes the connection's TLS
// session (with TLS on), hands the bytes it reads to its TlsSetup (tls_setup.h, the state
// machine both ends share) and acts on the outcome: the session starts, or the link refuses
// its queue (the peer refused us, or we it) or retries (the connection broke).
//
// Threads: as SocketLink (link.h): every function here runs with mu_ held, on an io_context
// thread or inside on_connected().
#include <spdlog/spdlog.h>

#include "podium/channel/link.h"

namespace podium::channel::internal {

void SocketLink::start_setup_locked() {
  if (core_->tls_enabled()) {
    if (!core_->tls) {
      refused_locked(ChannelErrc::kTlsFailed, "TLS to " + to_text_ + ": " + core_->tls_error);
      return;
    }
    auto session = TlsSession::make(*core_->tls, TlsSession::Role::kDialler);
    if (!session) {
      refused_locked(ChannelErrc::kTlsFailed, session.error().message);
      return;
    }
    tls_ = std::move(*session);
  }
  setup_.emplace(TlsSetup::Role::kDialler, tls_.get(), core_->config.secret, to_text_);
  after_setup_locked(setup_->start(socket_.native_handle()));
}

void SocketLink::on_setup_input(uint64_t gen, const std::error_code& ec, size_t n) {
  std::lock_guard lock(mu_);
  if (gen != gen_ || state_ != State::kConnected || !setup_) return;
  if (ec) {
    after_setup_locked(setup_->read_failed(ec == asio::error::eof, ec.message()));
    return;
  }
  after_setup_locked(setup_->input(socket_.native_handle(), n));
}

void SocketLink::after_setup_locked(TlsSetup::Status status) {
  if (status == TlsSetup::Status::kFailed) {
    using F = TlsSetup::Failure;
    F kind = setup_->failure();
    std::string why = setup_->why();  // failed_locked() drops the setup
    switch (kind) {
      case F::kTls:
        refused_locked(ChannelErrc::kTlsFailed, why);
        return;
      case F::kAuth:
        auth_failed_locked(why);
        return;
      case F::kLocal:
        // Not the peer's doing (CH-18): counted, and retried after the backoff like a
        // broken connection; the reason goes with what expires meanwhile.
        core_->count(Core::Refusal::kLocal);
        spdlog::error("channel: link to {}: {}", to_text_, why);
        failed_locked(why);
        return;
      case F::kNone:
      case F::kPeer:
      case F::kWrite:
        failed_locked(why);
        return;
    }
  }
  if (tls_ && tls_->output_pending() && !send_tls_locked()) return;
  if (status == TlsSetup::Status::kWantInput) {
    auto into = setup_->input_space();
    socket_.async_read_some(
        asio::buffer(into.data(), into.size()),
        [self = std::static_pointer_cast<SocketLink>(shared_from_this()), gen = gen_](
            const std::error_code& ec, size_t n) { self->on_setup_input(gen, ec, n); });
    return;
  }
  setup_.reset();
  authenticating_ = false;
  auth_timer_.cancel();
  start_session_locked();
}

bool SocketLink::send_tls_locked() {
  if (int rc = tls_->flush(socket_.native_handle()); rc < 0) {
    failed_locked(errno_error("TLS: write", -rc).message);
    return false;
  }
  if (tls_->output_pending() && !write_waiting_) {
    write_waiting_ = true;
    socket_.async_wait(Socket::wait_write,
                       [self = std::static_pointer_cast<SocketLink>(shared_from_this()),
                        gen = gen_](const std::error_code& ec) { self->on_writable(gen, ec); });
  }
  return true;
}

}  // namespace podium::channel::internal
