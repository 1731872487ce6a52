// Internal to podium_channel: the setup a TCP connection runs before its first frame, one
// state machine for both ends (docs/channel.md, "Authentication" and "TLS"). It runs CH-9's
// greeting, TLS handshake and confirmation, and CH-8's challenge, response and verdict:
// inside TLS when the Net has TLS, in plaintext when it has only a secret. SocketLink (the
// dialler, link_tls.cc) and Inbound (the listener, inbound.cc) each hold one while their
// connection sets up, and do its socket reads:
//
//   status = setup.start(fd);  // sends what this role sends first
//   while (status == kWantInput) {
//     n = (read some bytes of the socket into setup.input_space());
//     status = setup.input(fd, n);  // or setup.read_failed(...) on an error or EOF
//   }
//   kReady: frames may flow (the dialler's Hello first); kFailed: close with failure() and
//   why(), which name the step and, for the dialler, the peer.
//
// The setup writes its own bytes on `fd`, which must be non-blocking: plaintext directly,
// ciphertext through the TlsSession. Ciphertext the socket did not take yet
// (TlsSession::output_pending()) is the owner's to flush once the socket is writable, as it
// does for frames.
//
// Steps, by role and mode ([x]: read, x: written, (...): only with a secret):
//   dialler,  TLS:    ClientHello [greeting] handshake [confirm] ([challenge] response [verdict])
//   listener, TLS:    greeting handshake confirm (+challenge) ([response] verdict)
//   dialler,  secret: [challenge] response [verdict]
//   listener, secret: challenge [response] verdict
//
// Threads: not thread-safe. The owner calls it under its own mutex (SocketLink::mu_,
// Inbound::mu_), from its read completions; the TlsSession it drives outlives it.
//
// Invariants: CH-8 and CH-9 (net.h) are what this runs. Its own:
//   CH-17 A setup step that reads plaintext (the dialler's greeting, challenge and verdict
//         without TLS, the listener's response without TLS) offers the socket no more room
//         than the bytes the step still needs: what the peer sends after the setup (its TLS
//         records, its frames) stays on the socket for the next reader.
//   CH-18 A setup that fails says why and which kind of failure (Failure): the peer refused
//         (kTls, kAuth), went (kPeer), the socket failed (kWrite), or this process could not
//         run its side of CH-8 (kLocal: no random bytes, no HMAC, counted in
//         NetStats::setup_errors). No failure is an exception, none is silent.
//   CH-28 A plaintext dialler whose listener closes before sending any byte of its verdict
//         fails as the connection's fault (kPeer: retried after the backoff), not as a
//         refusal: a listener that refuses writes its verdict before it closes, and the
//         dialler sends nothing after its response that could make the kernel drop it, so no
//         verdict at all means the listener ended (a proc killed while it was dialled) or
//         closed without deciding. A part of a verdict is still a refusal (kAuth).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "podium/channel/auth.h"
#include "podium/channel/tls.h"

namespace podium::channel::internal {

class TlsSetup {
 public:
  enum class Role : uint8_t { kDialler, kListener };
  enum class Status : uint8_t { kWantInput, kReady, kFailed };
  enum class Failure : uint8_t {
    kNone,
    kTls,    // a refused handshake, or one side speaks TLS and the other not
    kAuth,   // CH-8 refused (a wrong or missing secret, a forged proof)
    kPeer,   // the peer closed, reset or sent what the setup does not expect
    kWrite,  // the socket did not take this side's bytes
    kLocal,  // this process could not run its side (no random bytes, no HMAC)
  };

  // `tls`: the connection's session, or null for CH-8 alone. `secret`: Config::secret, empty
  // when none; it must outlive the setup. `peer`: names the peer in the dialler's messages
  // (the listener's owner names it in its own log line).
  TlsSetup(Role role, TlsSession* tls, const std::string& secret, std::string peer);
  TlsSetup(const TlsSetup&) = delete;
  TlsSetup& operator=(const TlsSetup&) = delete;

  // Sends what this role sends first (the listener's greeting or challenge, the dialler's
  // ClientHello). Call once.
  [[nodiscard]] Status start(int fd);
  // Where the next socket read lands (after start() or input() said kWantInput): never
  // empty then. A plaintext step offers only the bytes it still needs (CH-17).
  std::span<std::byte> input_space();
  // `n` bytes landed in input_space(): runs the setup as far as they allow.
  [[nodiscard]] Status input(int fd, size_t n);
  // The read failed (`eof`: the peer closed; else `what` says why): always kFailed.
  [[nodiscard]] Status read_failed(bool eof, const std::string& what);

  Failure failure() const { return failure_; }
  const std::string& why() const { return why_; }
  // Still in the TLS handshake (for the listener's handshake-timeout message).
  bool in_tls_handshake() const { return tls_ && step_ == Step::kHandshake; }

 private:
  enum class Step : uint8_t {
    kStart,
    kGreeting,   // dialler, TLS: the listener's plaintext greeting
    kHandshake,  // TLS handshake
    kConfirm,    // dialler, TLS: the listener's confirmation byte
    kChallenge,  // dialler: the CH-8 challenge
    kResponse,   // listener: the dialler's CH-8 response
    kVerdict,    // dialler: the listener's CH-8 verdict
    kReady,
    kFailed,
  };
  bool dialler() const { return role_ == Role::kDialler; }
  bool plaintext_step() const { return !tls_ || step_ == Step::kGreeting; }
  size_t need() const;  // bytes the current read step takes
  Status advance(int fd);
  // True once in_ holds need() bytes; false when it must wait for input or it failed.
  bool take();
  // The steps that do more than read.
  bool handshake(int fd, bool& want_input);
  bool greeting_read();
  bool confirm_read();
  bool challenge_read(int fd);
  bool response_read(int fd);
  bool verdict_read();
  bool send_confirm(int fd);
  // Writes `bytes` on fd (through TLS when on) and flushes; false when it failed, which
  // fails the setup unless `best_effort`.
  bool write(int fd, std::span<const uint8_t> bytes, bool best_effort = false);
  bool write_plain(int fd, std::span<const uint8_t> bytes, const char* what, bool best_effort);
  bool flush(int fd);
  Status want_input();
  Status fail(Failure kind, std::string why);
  Status fail_with(const Error& e);  // kLocal: an auth.h function failed

  const Role role_;
  TlsSession* const tls_;
  const std::string& secret_;
  const std::string peer_;
  Step step_ = Step::kStart;
  // The plaintext of the current read step received so far (the longest is the response).
  std::array<uint8_t, kResponseBytes> in_{};
  size_t have_ = 0;
  bool nothing_read_ = true;             // no input yet (tells a TLS peer by its first bytes)
  const std::byte* read_into_ = nullptr;  // where the pending read lands
  Nonce server_nonce_{}, client_nonce_{};
  Failure failure_ = Failure::kNone;
  std::string why_;
};

// The dialler's messages for a listener whose first bytes say what this process lacks; the
// frame reader of a plaintext link without a secret says them too (link.cc).
std::string tls_required_message(std::string_view peer);
std::string secret_required_message(std::string_view peer);

}  // namespace podium::channel::internal
