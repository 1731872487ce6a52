// SocketLink's TLS setup (CH-9), the dialler's side: send the ClientHello, read the
// listener's greeting, finish the handshake, read its confirmation, then (with a secret) the
// challenge and verdict of CH-8 inside TLS. The listener's side is Inbound's (inbound.cc).
//
// Threads: as SocketLink (link.h): every function here runs with mu_ held, on an io_context
// thread or inside on_connected().
// Invariants: CH-8, CH-9 (net.h).
#include <spdlog/spdlog.h>

#include <asio/read.hpp>

#include "podium/channel/link.h"

namespace podium::channel::internal {

// ---- SocketLink: TLS setup (CH-9) ----

void SocketLink::start_tls_locked() {
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
  tls_step_ = TlsStep::kGreeting;
  setup_in_.clear();
  // The ClientHello goes out before the greeting is read: a plaintext listener without a
  // secret says nothing until the dialler has spoken.
  if (tls_->handshake() == TlsSession::Step::kFailed) {
    refused_locked(ChannelErrc::kTlsFailed, "TLS to " + to_text_ + ": " + tls_->error());
    return;
  }
  if (!send_tls_locked()) return;
  asio::async_read(socket_, asio::buffer(greeting_),
                   [self = std::static_pointer_cast<SocketLink>(shared_from_this()), gen = gen_](
                       const std::error_code& ec, size_t) { self->on_tls_greeting(gen, ec); });
}

void SocketLink::on_tls_greeting(uint64_t gen, const std::error_code& ec) {
  std::lock_guard lock(mu_);
  if (gen != gen_ || state_ != State::kConnected || !tls_ || tls_step_ != TlsStep::kGreeting) {
    return;
  }
  if (ec) {
    failed_locked(ec == asio::error::eof ? "TLS: connection closed by peer before its greeting"
                                         : "TLS: read: " + ec.message());
    return;
  }
  switch (classify_greeting(greeting_)) {
    case Greeting::kTls:
      break;
    case Greeting::kChallenge:
    case Greeting::kPlaintextNotice:
      refused_locked(ChannelErrc::kTlsFailed,
                     "the peer at " + to_text_ +
                         " does not use TLS, and this process requires it (set the same "
                         "PODIUM_TLS_* on both)");
      return;
    case Greeting::kUnknown:
      refused_locked(ChannelErrc::kTlsFailed,
                     "the peer at " + to_text_ + " did not greet as a podium TLS listener");
      return;
  }
  tls_step_ = TlsStep::kHandshake;
  advance_tls_locked();
}

void SocketLink::on_tls_input(uint64_t gen, const std::error_code& ec, size_t n) {
  std::lock_guard lock(mu_);
  if (gen != gen_ || state_ != State::kConnected || !tls_) return;
  if (ec) {
    failed_locked(ec == asio::error::eof ? "TLS: connection closed by peer during the TLS setup"
                                         : "TLS: read: " + ec.message());
    return;
  }
  tls_->commit_input(n);
  advance_tls_locked();
}

void SocketLink::advance_tls_locked() {
  const std::string& secret = core_->config.secret;
  for (;;) {
    switch (tls_step_) {
      case TlsStep::kGreeting:
      case TlsStep::kReady:
        return;
      case TlsStep::kHandshake: {
        auto step = tls_->handshake();
        if (step == TlsSession::Step::kFailed) {
          // The alert that tells the listener why goes first, best effort.
          (void)tls_->flush(socket_.native_handle());
          refused_locked(ChannelErrc::kTlsFailed,
                         "TLS handshake with " + to_text_ + " failed: " + tls_->error());
          return;
        }
        if (!send_tls_locked()) return;
        if (step == TlsSession::Step::kWantInput) {
          read_tls_locked();
          return;
        }
        tls_step_ = TlsStep::kConfirm;
        setup_in_.clear();
        break;
      }
      case TlsStep::kConfirm: {
        if (!take_tls_locked(1)) return;
        uint8_t confirm = setup_in_[0];
        setup_in_.clear();
        if (confirm == kTlsConfirmChallenge && secret.empty()) {
          auth_failed_locked("the peer at " + to_text_ +
                             " requires authentication, and this process has no secret (set "
                             "PODIUM_SECRET or PODIUM_SECRET_FILE)");
          return;
        }
        if (confirm == kTlsConfirm && !secret.empty()) {
          // The listener holds no secret: it cannot prove it is one of the job's.
          auth_failed_locked("the peer at " + to_text_ + " holds no secret; it is not trusted");
          return;
        }
        if (confirm != kTlsConfirm && confirm != kTlsConfirmChallenge) {
          refused_locked(ChannelErrc::kTlsFailed,
                         "the peer at " + to_text_ + " did not confirm the TLS setup");
          return;
        }
        if (secret.empty()) {
          tls_ready_locked();
          return;
        }
        tls_step_ = TlsStep::kChallenge;
        break;
      }
      case TlsStep::kChallenge: {
        if (!take_tls_locked(kChallengeBytes)) return;
        if (!parse_challenge(setup_in_, server_nonce_)) {
          auth_failed_locked("the peer at " + to_text_ + " did not send a podium challenge");
          return;
        }
        setup_in_.clear();
        try {
          client_nonce_ = random_nonce();
          response_ = auth_response(secret, server_nonce_, client_nonce_);
        } catch (const std::exception& e) {
          failed_locked(std::string("authentication: ") + e.what());
          return;
        }
        iovec v{response_.data(), response_.size()};
        if (ssize_t n = tls_->write(socket_.native_handle(), &v, 1); n != ssize_t(v.iov_len)) {
          failed_locked(n == -EPROTO ? "TLS: " + tls_->error()
                                     : errno_error("TLS: write", int(-n)).message);
          return;
        }
        if (!send_tls_locked()) return;
        tls_step_ = TlsStep::kVerdict;
        break;
      }
      case TlsStep::kVerdict: {
        if (!take_tls_locked(kVerdictBytes)) return;
        Verdict v = check_verdict(secret, client_nonce_, server_nonce_, setup_in_);
        setup_in_.clear();
        if (v == Verdict::kRefused) {
          auth_failed_locked("the peer at " + to_text_ +
                             " refused our secret (PODIUM_SECRET differs)");
          return;
        }
        if (v == Verdict::kForged) {
          auth_failed_locked("the peer at " + to_text_ +
                             " could not prove that it holds the secret");
          return;
        }
        tls_ready_locked();
        return;
      }
    }
  }
}

bool SocketLink::take_tls_locked(size_t need) {
  size_t have = setup_in_.size();
  if (have >= need) return true;
  setup_in_.resize(need);
  auto r = tls_->read(std::as_writable_bytes(std::span(setup_in_).subspan(have)));
  setup_in_.resize(have + r.n);
  if (r.failed) {
    // Typically the listener's alert: it refused our certificate.
    refused_locked(ChannelErrc::kTlsFailed, "TLS with " + to_text_ + " failed: " + tls_->error());
    return false;
  }
  if (r.closed) {
    failed_locked("TLS: the peer closed the TLS stream during the setup");
    return false;
  }
  if (setup_in_.size() < need) {
    read_tls_locked();
    return false;
  }
  return true;
}

void SocketLink::tls_ready_locked() {
  tls_step_ = TlsStep::kReady;
  authenticating_ = false;
  auth_timer_.cancel();
  start_session_locked();
}

void SocketLink::read_tls_locked() {
  auto into = tls_->input_space();
  if (into.empty()) {  // the peer sent more than the setup consumes
    failed_locked("TLS: protocol error: unexpected data from the peer during the TLS setup");
    return;
  }
  socket_.async_read_some(
      asio::buffer(into.data(), into.size()),
      [self = std::static_pointer_cast<SocketLink>(shared_from_this()), gen = gen_](
          const std::error_code& ec, size_t n) { self->on_tls_input(gen, ec, n); });
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
