#include "podium/channel/tls_setup.h"

#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "podium/channel/socket_util.h"

namespace podium::channel::internal {

std::string tls_required_message(std::string_view peer) {
  return "the peer at " + std::string(peer) +
         " requires TLS, and this process has no TLS configured (set PODIUM_TLS_CERT, "
         "PODIUM_TLS_KEY and PODIUM_TLS_CA)";
}

std::string secret_required_message(std::string_view peer) {
  return "the peer at " + std::string(peer) +
         " requires authentication, and this process has no secret (set PODIUM_SECRET or "
         "PODIUM_SECRET_FILE)";
}

TlsSetup::TlsSetup(Role role, TlsSession* tls, const std::string& secret, std::string peer)
    : role_(role), tls_(tls), secret_(secret), peer_(std::move(peer)) {}

size_t TlsSetup::need() const {
  switch (step_) {
    case Step::kGreeting: return kGreetingBytes;
    case Step::kConfirm: return 1;
    case Step::kChallenge: return kChallengeBytes;
    case Step::kResponse: return kResponseBytes;
    case Step::kVerdict: return kVerdictBytes;
    default: return 0;
  }
}

TlsSetup::Status TlsSetup::start(int fd) {
  if (dialler()) {
    if (!tls_) {
      step_ = Step::kChallenge;
      return want_input();
    }
    // The ClientHello goes out before the greeting is read: a plaintext listener without a
    // secret says nothing until the dialler has spoken.
    if (tls_->handshake() == TlsSession::Step::kFailed) {
      return fail(Failure::kTls, "TLS to " + peer_ + ": " + tls_->error());
    }
    if (!flush(fd)) return Status::kFailed;
    step_ = Step::kGreeting;
    return want_input();
  }
  if (tls_) {
    // The greeting goes out before anything is read: a plaintext dialler with a secret waits
    // for a challenge, and learns from the greeting that this listener requires TLS.
    step_ = Step::kHandshake;
    return write_plain(fd, tls_greeting(), "TLS: write", false) ? want_input() : Status::kFailed;
  }
  auto nonce = random_nonce();
  if (!nonce) return fail_with(nonce.error());
  server_nonce_ = *nonce;
  step_ = Step::kResponse;
  return write(fd, auth_challenge(server_nonce_)) ? want_input() : Status::kFailed;
}

std::span<std::byte> TlsSetup::input_space() {
  std::span<std::byte> into;
  if (plaintext_step()) {
    into = std::as_writable_bytes(std::span(in_)).subspan(have_, need() - have_);
  } else {
    into = tls_->input_space();
  }
  read_into_ = into.data();
  return into;
}

TlsSetup::Status TlsSetup::want_input() {
  // A TLS ring with no room: the peer sent more than the setup consumes.
  if (!plaintext_step() && tls_->input_space().empty()) {
    return fail(Failure::kPeer, dialler() ? "TLS: protocol error: unexpected data from the peer "
                                            "during the TLS setup"
                                          : "refused: protocol error: unexpected data during "
                                            "the TLS setup");
  }
  return Status::kWantInput;
}

TlsSetup::Status TlsSetup::input(int fd, size_t n) {
  if (step_ == Step::kReady) return Status::kReady;
  if (step_ == Step::kFailed) return Status::kFailed;
  if (std::exchange(nothing_read_, false) && !dialler() && tls_ && n > 0 &&
      !looks_like_tls({read_into_, n})) {
    return fail(Failure::kTls, "refused: the peer does not speak TLS, and this listener "
                               "requires it");
  }
  if (plaintext_step()) {
    have_ += n;
  } else {
    tls_->commit_input(n);
  }
  return advance(fd);
}

TlsSetup::Status TlsSetup::read_failed(bool eof, const std::string& what) {
  bool silent = std::exchange(nothing_read_, false);
  if (dialler()) {
    if (!tls_ && step_ == Step::kVerdict) {
      if (have_ == 0) {
        // CH-28: a listener that refuses writes its verdict before it closes, and nothing
        // makes the kernel drop it (the dialler sends nothing after its response). No byte of
        // it: the listener ended, or closed without deciding; a broken connection, retried.
        return fail(Failure::kPeer,
                    "authentication: the peer at " + peer_ +
                        " closed the connection before its verdict (" +
                        (eof ? std::string("end of stream") : what) + "); it may have exited");
      }
      // A part of the verdict: a refusal cut short.
      return fail(Failure::kAuth, "the peer at " + peer_ +
                                      " closed the connection during authentication (wrong or "
                                      "missing secret?)");
    }
    if (!tls_) {
      return fail(Failure::kPeer,
                  "authentication: " + (eof ? std::string("connection closed by peer") : what));
    }
    if (!eof) return fail(Failure::kPeer, "TLS: read: " + what);
    return fail(Failure::kPeer, step_ == Step::kGreeting
                                    ? "TLS: connection closed by peer before its greeting"
                                    : "TLS: connection closed by peer during the TLS setup");
  }
  if (!tls_) {
    return fail(Failure::kPeer, "authentication: the peer left before answering (" + what + ")");
  }
  if (!eof) return fail(Failure::kPeer, "refused: TLS: read: " + what);
  return fail(Failure::kPeer,
              silent ? "refused: the peer closed the connection before the TLS handshake (a "
                       "podium process without TLS? this listener requires it)"
              : step_ == Step::kResponse
                  ? "refused: the peer closed the connection instead of answering the "
                    "authentication challenge (it holds no secret?)"
                  : "refused: the peer closed the connection during the TLS handshake");
}

TlsSetup::Status TlsSetup::advance(int fd) {
  for (;;) {
    bool ok = true;
    switch (step_) {
      case Step::kStart:
      case Step::kFailed:
        return Status::kFailed;
      case Step::kReady:
        return Status::kReady;
      case Step::kHandshake: {
        bool want = false;
        ok = handshake(fd, want);
        if (ok && want) return want_input();
        break;
      }
      case Step::kGreeting:
        if (!take()) return want_input();
        ok = greeting_read();
        break;
      case Step::kConfirm:
        if (!take()) return want_input();
        ok = confirm_read();
        break;
      case Step::kChallenge:
        if (!take()) return want_input();
        ok = challenge_read(fd);
        break;
      case Step::kResponse:
        if (!take()) return want_input();
        ok = response_read(fd);
        break;
      case Step::kVerdict:
        if (!take()) return want_input();
        ok = verdict_read();
        break;
    }
    if (!ok || step_ == Step::kFailed) return Status::kFailed;
    have_ = 0;
  }
}

bool TlsSetup::take() {
  if (step_ == Step::kFailed) return false;
  size_t want = need();
  if (have_ >= want) return true;
  if (plaintext_step()) return false;  // input() adds what the socket gave
  auto r = tls_->read(std::as_writable_bytes(std::span(in_)).subspan(have_, want - have_));
  have_ += r.n;
  if (r.failed) {
    // Typically the other side's alert: it refused our certificate.
    fail(Failure::kTls, dialler() ? "TLS with " + peer_ + " failed: " + tls_->error()
                                  : "refused: TLS: " + tls_->error());
    return false;
  }
  if (r.closed) {
    fail(Failure::kPeer, dialler() ? "TLS: the peer closed the TLS stream during the setup"
                                   : "the peer closed the TLS stream during the setup");
    return false;
  }
  return have_ >= want;
}

bool TlsSetup::handshake(int fd, bool& want_input) {
  auto step = tls_->handshake();
  if (step == TlsSession::Step::kFailed) {
    // The alert that tells the other side why goes first, best effort.
    (void)tls_->flush(fd);
    fail(Failure::kTls, dialler() ? "TLS handshake with " + peer_ + " failed: " + tls_->error()
                                  : "refused: TLS handshake failed: " + tls_->error());
    return false;
  }
  if (!flush(fd)) return false;
  if (step == TlsSession::Step::kWantInput) {
    want_input = true;
    return true;
  }
  if (dialler()) {
    step_ = Step::kConfirm;
    return true;
  }
  return send_confirm(fd);
}

// The listener accepted the handshake: it confirms, and challenges when this Net holds a
// secret (CH-8 inside TLS).
bool TlsSetup::send_confirm(int fd) {
  std::array<uint8_t, 1 + kChallengeBytes> out{};
  size_t len = 1;
  out[0] = secret_.empty() ? kTlsConfirm : kTlsConfirmChallenge;
  if (!secret_.empty()) {
    auto nonce = random_nonce();
    if (!nonce) {
      fail_with(nonce.error());
      return false;
    }
    server_nonce_ = *nonce;
    auto challenge = auth_challenge(server_nonce_);
    std::memcpy(out.data() + 1, challenge.data(), challenge.size());
    len += challenge.size();
  }
  if (!write(fd, std::span(out).first(len))) return false;
  step_ = secret_.empty() ? Step::kReady : Step::kResponse;
  return true;
}

bool TlsSetup::greeting_read() {
  switch (classify_greeting(std::span(in_).first(kGreetingBytes))) {
    case Greeting::kTls:
      step_ = Step::kHandshake;
      return true;
    case Greeting::kChallenge:
    case Greeting::kPlaintextNotice:
      fail(Failure::kTls, "the peer at " + peer_ +
                              " does not use TLS, and this process requires it (set the same "
                              "PODIUM_TLS_* on both)");
      return false;
    case Greeting::kUnknown:
      break;
  }
  fail(Failure::kTls, "the peer at " + peer_ + " did not greet as a podium TLS listener");
  return false;
}

bool TlsSetup::confirm_read() {
  uint8_t confirm = in_[0];
  if (confirm == kTlsConfirmChallenge && secret_.empty()) {
    fail(Failure::kAuth, secret_required_message(peer_));
    return false;
  }
  if (confirm == kTlsConfirm && !secret_.empty()) {
    // The listener holds no secret: it cannot prove it is one of the job's.
    fail(Failure::kAuth, "the peer at " + peer_ + " holds no secret; it is not trusted");
    return false;
  }
  if (confirm != kTlsConfirm && confirm != kTlsConfirmChallenge) {
    fail(Failure::kTls, "the peer at " + peer_ + " did not confirm the TLS setup");
    return false;
  }
  step_ = secret_.empty() ? Step::kReady : Step::kChallenge;
  return true;
}

bool TlsSetup::challenge_read(int fd) {
  auto bytes = std::span(in_).first(kChallengeBytes);
  if (!parse_challenge(bytes, server_nonce_)) {
    if (!tls_ && classify_greeting(bytes) == Greeting::kTls) {
      fail(Failure::kTls, tls_required_message(peer_));
    } else {
      fail(Failure::kAuth, "the peer at " + peer_ + " did not send a podium challenge");
    }
    return false;
  }
  auto nonce = random_nonce();
  if (!nonce) {
    fail_with(nonce.error());
    return false;
  }
  client_nonce_ = *nonce;
  auto response = auth_response(secret_, server_nonce_, client_nonce_);
  if (!response) {
    fail_with(response.error());
    return false;
  }
  if (!write(fd, *response)) return false;
  step_ = Step::kVerdict;
  return true;
}

bool TlsSetup::response_read(int fd) {
  auto bytes = std::span(in_).first(kResponseBytes);
  Nonce client_nonce{};
  auto ok = verify_response(secret_, server_nonce_, bytes, client_nonce);
  if (!ok) {
    fail_with(ok.error());
    return false;
  }
  auto verdict = auth_verdict(*ok, secret_, client_nonce, server_nonce_);
  if (!verdict) {
    fail_with(verdict.error());
    return false;
  }
  if (!*ok) {
    // Tell the dialler why (best effort: the refusal stands whether it got there or not).
    (void)write(fd, *verdict, /*best_effort=*/true);
    fail(Failure::kAuth,
         !tls_ && looks_like_tls(std::as_bytes(bytes))
             ? "refused: the peer speaks TLS, and this listener has no TLS configured"
             : "refused: authentication failed (wrong or missing secret)");
    return false;
  }
  if (!write(fd, *verdict)) return false;
  step_ = Step::kReady;
  return true;
}

bool TlsSetup::verdict_read() {
  auto v = check_verdict(secret_, client_nonce_, server_nonce_,
                         std::span(in_).first(kVerdictBytes));
  if (!v) {
    fail_with(v.error());
    return false;
  }
  if (*v == Verdict::kRefused) {
    fail(Failure::kAuth, "the peer at " + peer_ + " refused our secret (PODIUM_SECRET differs)");
    return false;
  }
  if (*v == Verdict::kForged) {
    fail(Failure::kAuth, "the peer at " + peer_ + " could not prove that it holds the secret");
    return false;
  }
  step_ = Step::kReady;
  return true;
}

bool TlsSetup::write(int fd, std::span<const uint8_t> bytes, bool best_effort) {
  if (!tls_) return write_plain(fd, bytes, "authentication: write", best_effort);
  iovec v{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  ssize_t n = tls_->write(fd, &v, 1);
  if (n == ssize_t(bytes.size())) return flush(fd);
  if (!best_effort) {
    fail(Failure::kWrite, n == -EPROTO ? "TLS: " + tls_->error()
                          : n < 0      ? errno_error("TLS: write", int(-n)).message
                                       : std::string("TLS: the setup did not fit the output buffer"));
  }
  return false;
}

// The setup's plaintext is a few dozen bytes, the first the connection writes or the answer
// to what the peer just sent: an empty socket buffer takes it whole.
bool TlsSetup::write_plain(int fd, std::span<const uint8_t> bytes, const char* what,
                           bool best_effort) {
  iovec v{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  ssize_t n = send_iov(fd, &v, 1);
  if (n == ssize_t(bytes.size())) return true;
  if (!best_effort) {
    fail(Failure::kWrite, n < 0 ? errno_error(what, int(-n)).message
                                : std::string(what) + ": the socket buffer did not take " +
                                      std::to_string(bytes.size()) + " bytes");
  }
  return false;
}

bool TlsSetup::flush(int fd) {
  if (int rc = tls_->flush(fd); rc < 0) {
    fail(Failure::kWrite, errno_error("TLS: write", -rc).message);
    return false;
  }
  return true;
}

TlsSetup::Status TlsSetup::fail(Failure kind, std::string why) {
  if (step_ != Step::kFailed) {  // the first failure is the reason
    step_ = Step::kFailed;
    failure_ = kind;
    why_ = std::move(why);
  }
  return Status::kFailed;
}

TlsSetup::Status TlsSetup::fail_with(const Error& e) {
  return fail(Failure::kLocal, e.message);
}

}  // namespace podium::channel::internal
