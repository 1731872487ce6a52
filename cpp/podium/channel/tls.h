// Internal to podium_channel: TLS 1.3 on TCP connections (CH-9, docs/channel.md).
//
// A TlsSession is OpenSSL's state for one connection, driven through a pair of memory rings
// (a BIO pair), never through the socket: the link or inbound connection that owns the socket
// keeps doing every socket operation itself, under its own mutex, as it does in plaintext.
// Ciphertext read from the socket goes into the session's input ring (input_space(),
// commit_input()); read() decrypts from it; write() encrypts plaintext into the output ring
// and sends that ring's ciphertext on the socket until the socket is full.
//
// Before the handshake, a TLS listener writes a plaintext greeting as long as a CH-8
// challenge, so that a peer of either kind learns at once what the other speaks:
//
//   greeting (TLS listener)               "PDMT" 0x01 0x00 x 32
//   notice (plaintext listener, to a TLS client, then close)   "PDMP" 0x01 0x00 x 32
//
// Threads: a TlsSession's methods are thread-safe (one mutex, so an inbound connection's read
// chain may decrypt while its ack timer encrypts). OpenSSL's error queue is per thread; each
// method reads what its own calls left there.
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "podium/base/error.h"
#include "podium/channel/tls_config.h"

struct ssl_ctx_st;
struct ssl_st;
struct bio_st;

namespace podium::channel::internal {

constexpr size_t kGreetingBytes = 37;  // = kChallengeBytes (auth.h)
std::array<uint8_t, kGreetingBytes> tls_greeting();
std::array<uint8_t, kGreetingBytes> plaintext_notice();

// After the handshake, the listener's first plaintext byte inside TLS: the setup is accepted,
// and with kTlsConfirmChallenge a CH-8 challenge follows (the listener holds a secret).
constexpr uint8_t kTlsConfirm = 0x01;
constexpr uint8_t kTlsConfirmChallenge = 0x02;

enum class Greeting : uint8_t { kTls, kChallenge, kPlaintextNotice, kUnknown };
// What the first bytes a listener sent say about it (a prefix of at least 5 bytes suffices).
Greeting classify_greeting(std::span<const uint8_t> bytes);
// True when `bytes` (at least one) start like a TLS handshake record (a ClientHello).
bool looks_like_tls(std::span<const std::byte> bytes);

// One Net's certificate, key and trusted CAs, parsed once (TLS 1.3 only, peers must present
// a certificate that chains to a trusted CA, no session tickets).
class TlsContext {
 public:
  [[nodiscard]] static Result<std::shared_ptr<TlsContext>> make(const TlsConfig& config);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;
  ssl_ctx_st* get() const { return ctx_; }

 private:
  explicit TlsContext(ssl_ctx_st* ctx) : ctx_(ctx) {}
  ssl_ctx_st* ctx_;
};

class TlsSession {
 public:
  enum class Role : uint8_t { kDialler, kListener };
  [[nodiscard]] static Result<std::unique_ptr<TlsSession>> make(const TlsContext& context,
                                                                Role role);
  ~TlsSession();
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  enum class Step : uint8_t { kDone, kWantInput, kFailed };
  // Advances the handshake with the input received so far. kFailed: error() says why,
  // naming OpenSSL's reason and, when the peer's certificate was refused, the verify error
  // ("certificate verify failed: unable to get local issuer certificate"). Output (the
  // handshake's messages, or the alert that ends a failed one) waits for flush().
  Step handshake();

  // Where the next socket read may land, and how many bytes landed there.
  std::span<std::byte> input_space();
  void commit_input(size_t n);
  // Whether read() may produce something without more input from the socket.
  bool input_buffered();

  struct Read {
    size_t n = 0;         // plaintext bytes written to `out`; 0 with ok: needs more input
    bool closed = false;  // the peer closed the TLS stream (close_notify)
    bool failed = false;  // a TLS error (a peer's alert, a forged record): error() says it
  };
  // Decrypts into `out` until it is full or the input runs out.
  Read read(std::span<std::byte> out);

  // Encrypts as much of `iov` as the output ring takes and sends ciphertext on `fd` until the
  // ring is empty or the socket is full. Returns the plaintext bytes taken (final: they are
  // encrypted and on their way), or -errno when the socket failed, or -EPROTO on a TLS error
  // (error() says it). Ciphertext may remain: see output_pending().
  ssize_t write(int fd, const iovec* iov, size_t count);
  // Sends waiting ciphertext until none is left or the socket is full; 0 or -errno.
  int flush(int fd);
  bool output_pending();

  // Why the last handshake(), read() or write() failed: OpenSSL's reason, and the verify
  // error when a certificate was refused.
  std::string error();

 private:
  TlsSession(ssl_st* ssl, bio_st* network) : ssl_(ssl), network_(network) {}
  int flush_locked(int fd);
  void set_error_locked(int rc);  // OpenSSL's reason for the failed call's result `rc`

  std::mutex mu_;
  // Guarded by mu_:
  ssl_st* ssl_;
  bio_st* network_;  // our end of the BIO pair; the SSL owns the other end
  std::string error_;
  std::array<std::byte, 16384> staging_;  // small pieces of plaintext gathered for one record
};

}  // namespace podium::channel::internal
