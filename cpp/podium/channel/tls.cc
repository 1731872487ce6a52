#include "podium/channel/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "podium/channel/net.h"

namespace podium::channel {
namespace {

std::unexpected<Error> tls_error(std::string message) {
  return std::unexpected(make_error(ChannelErrc::kTlsFailed, std::move(message)));
}

// OpenSSL's reason for the oldest error this thread queued ("certificate verify failed"),
// or `fallback`; empties the queue.
std::string openssl_reason(const char* fallback) {
  std::string reason;
  while (unsigned long e = ERR_get_error()) {
    if (!reason.empty()) continue;
    const char* r = ERR_reason_error_string(e);
    if (r) {
      reason = r;
    } else {
      char buf[256];
      ERR_error_string_n(e, buf, sizeof buf);
      reason = buf;
    }
  }
  return reason.empty() ? fallback : reason;
}

// A passphrase callback that refuses, so that OpenSSL never prompts on a terminal for an
// encrypted key.
int no_passphrase(char*, int, int, void*) { return -1; }

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;

BioPtr memory_bio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

}  // namespace

Result<TlsConfig> load_tls_files(const std::string& cert_path, const std::string& key_path,
                                 const std::string& ca_path) {
  auto read = [](const char* what, const std::string& path) -> Result<std::string> {
    std::ifstream in(path, std::ios::binary);
    if (!in) return tls_error(std::string("TLS ") + what + " file " + path + ": cannot read it");
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  TlsConfig c;
  auto cert = read("certificate", cert_path);
  if (!cert) return std::unexpected(cert.error());
  auto key = read("key", key_path);
  if (!key) return std::unexpected(key.error());
  auto ca = read("CA", ca_path);
  if (!ca) return std::unexpected(ca.error());
  c.cert_pem = std::move(*cert);
  c.key_pem = std::move(*key);
  c.ca_pem = std::move(*ca);
  return c;
}

Status check_tls_config(const TlsConfig& config) {
  auto ctx = internal::TlsContext::make(config);
  if (!ctx) return std::unexpected(ctx.error());
  return ok();
}

}  // namespace podium::channel

namespace podium::channel::internal {
namespace {

constexpr uint8_t kGreetingVersion = 1;
// Each ring of a session's BIO pair. The output ring holds ciphertext the socket has not
// taken yet (the kernel's socket buffer is the real queue); the input ring, what was read
// and not yet decrypted (at most one partial record between reads).
constexpr size_t kRingBytes = 128 * 1024;
// One TLS 1.3 record: at most 16 KiB of plaintext, plus 22 bytes of header, content type and
// AEAD tag; the margin covers them with room to spare.
constexpr size_t kMaxRecord = 16 * 1024;
constexpr size_t kRecordOverhead = 64;

std::array<uint8_t, kGreetingBytes> greeting_with(const char (&magic)[5]) {
  std::array<uint8_t, kGreetingBytes> out{};
  std::memcpy(out.data(), magic, 4);
  out[4] = kGreetingVersion;
  return out;
}

}  // namespace

std::array<uint8_t, kGreetingBytes> tls_greeting() { return greeting_with("PDMT"); }
std::array<uint8_t, kGreetingBytes> plaintext_notice() { return greeting_with("PDMP"); }

Greeting classify_greeting(std::span<const uint8_t> bytes) {
  if (bytes.size() < 5) return Greeting::kUnknown;
  auto is = [&](const char* magic) { return std::memcmp(bytes.data(), magic, 4) == 0; };
  if (is("PDMA")) return Greeting::kChallenge;
  if (bytes[4] != kGreetingVersion) return Greeting::kUnknown;
  if (is("PDMT")) return Greeting::kTls;
  if (is("PDMP")) return Greeting::kPlaintextNotice;
  return Greeting::kUnknown;
}

bool looks_like_tls(std::span<const std::byte> bytes) {
  // A TLS record of type handshake (22), legacy version 3.x; a first read may hold 1 byte.
  return !bytes.empty() && bytes[0] == std::byte{0x16} &&
         (bytes.size() < 2 || bytes[1] == std::byte{0x03});
}

// ---- TlsContext ----

Result<std::shared_ptr<TlsContext>> TlsContext::make(const TlsConfig& config) {
  std::string missing;
  if (config.cert_pem.empty()) missing += ", the certificate";
  if (config.key_pem.empty()) missing += ", the private key";
  if (config.ca_pem.empty()) missing += ", the CA certificate";
  if (!missing.empty()) {
    return tls_error("TLS needs a certificate, its private key and a CA certificate; missing: " +
                     missing.substr(2));
  }
  ERR_clear_error();
  SSL_CTX* raw = SSL_CTX_new(TLS_method());
  if (!raw) return tls_error("TLS: " + openssl_reason("SSL_CTX_new failed"));
  std::shared_ptr<TlsContext> ctx(new TlsContext(raw));
  SSL_CTX_set_min_proto_version(raw, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(raw, TLS1_3_VERSION);
  // Mutual: each end presents a certificate and refuses a peer without one the CA signed.
  SSL_CTX_set_verify(raw, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  // A link reconnects with a full handshake; tickets would only be bytes nobody uses.
  SSL_CTX_set_num_tickets(raw, 0);
  SSL_CTX_set_session_cache_mode(raw, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_default_passwd_cb(raw, no_passphrase);

  BioPtr certs = memory_bio(config.cert_pem);
  X509* leaf = PEM_read_bio_X509(certs.get(), nullptr, no_passphrase, nullptr);
  if (!leaf) return tls_error("TLS certificate: no PEM certificate in it");
  int used = SSL_CTX_use_certificate(raw, leaf);
  X509_free(leaf);
  if (used != 1) return tls_error("TLS certificate: " + openssl_reason("not usable"));
  while (X509* more = PEM_read_bio_X509(certs.get(), nullptr, no_passphrase, nullptr)) {
    if (SSL_CTX_add0_chain_cert(raw, more) != 1) {
      X509_free(more);
      return tls_error("TLS certificate chain: " + openssl_reason("not usable"));
    }
  }
  ERR_clear_error();  // the end of the PEM text reads as an error

  BioPtr key_bio = memory_bio(config.key_pem);
  EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio.get(), nullptr, no_passphrase, nullptr);
  if (!key) {
    ERR_clear_error();
    return tls_error(
        "TLS private key: no unencrypted PEM private key in it (an encrypted key is not "
        "supported)");
  }
  if (X509_check_private_key(SSL_CTX_get0_certificate(raw), key) != 1) {
    EVP_PKEY_free(key);
    ERR_clear_error();
    return tls_error("TLS private key: it does not match the certificate");
  }
  used = SSL_CTX_use_PrivateKey(raw, key);
  EVP_PKEY_free(key);
  if (used != 1) return tls_error("TLS private key: " + openssl_reason("not usable"));

  BioPtr cas = memory_bio(config.ca_pem);
  X509_STORE* store = SSL_CTX_get_cert_store(raw);
  int n = 0;
  while (X509* ca = PEM_read_bio_X509(cas.get(), nullptr, no_passphrase, nullptr)) {
    int added = X509_STORE_add_cert(store, ca);
    X509_free(ca);
    if (added != 1) return tls_error("TLS CA: " + openssl_reason("not usable"));
    ++n;
  }
  ERR_clear_error();
  if (n == 0) return tls_error("TLS CA: no PEM certificate in it");
  return ctx;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

// ---- TlsSession ----

Result<std::unique_ptr<TlsSession>> TlsSession::make(const TlsContext& context, Role role) {
  ERR_clear_error();
  SSL* ssl = SSL_new(context.get());
  if (!ssl) return tls_error("TLS: " + openssl_reason("SSL_new failed"));
  BIO* inner = nullptr;
  BIO* network = nullptr;
  if (BIO_new_bio_pair(&inner, kRingBytes, &network, kRingBytes) != 1) {
    SSL_free(ssl);
    return tls_error("TLS: " + openssl_reason("BIO_new_bio_pair failed"));
  }
  SSL_set_bio(ssl, inner, inner);  // the SSL owns `inner` now
  if (role == Role::kDialler) {
    SSL_set_connect_state(ssl);
  } else {
    SSL_set_accept_state(ssl);
  }
  return std::unique_ptr<TlsSession>(new TlsSession(ssl, network));
}

TlsSession::~TlsSession() {
  SSL_free(ssl_);
  BIO_free(network_);
}

void TlsSession::set_error_locked(int rc) {
  int kind = SSL_get_error(ssl_, rc);
  std::string reason = openssl_reason(kind == SSL_ERROR_ZERO_RETURN ? "the peer closed the TLS stream"
                                                                   : "unexpected end of stream");
  long verify = SSL_get_verify_result(ssl_);
  if (verify != X509_V_OK) {
    reason += std::string(": ") + X509_verify_cert_error_string(verify);
  }
  error_ = std::move(reason);
}

TlsSession::Step TlsSession::handshake() {
  std::lock_guard lock(mu_);
  ERR_clear_error();
  int rc = SSL_do_handshake(ssl_);
  if (rc == 1) return Step::kDone;
  if (SSL_get_error(ssl_, rc) == SSL_ERROR_WANT_READ) return Step::kWantInput;
  set_error_locked(rc);
  return Step::kFailed;
}

std::span<std::byte> TlsSession::input_space() {
  std::lock_guard lock(mu_);
  char* p = nullptr;
  int n = BIO_nwrite0(network_, &p);
  if (n <= 0) return {};
  return {reinterpret_cast<std::byte*>(p), size_t(n)};
}

void TlsSession::commit_input(size_t n) {
  std::lock_guard lock(mu_);
  char* p = nullptr;
  BIO_nwrite(network_, &p, static_cast<int>(n));
}

bool TlsSession::input_buffered() {
  std::lock_guard lock(mu_);
  return SSL_pending(ssl_) > 0 || BIO_ctrl_pending(SSL_get_rbio(ssl_)) > 0;
}

TlsSession::Read TlsSession::read(std::span<std::byte> out) {
  std::lock_guard lock(mu_);
  Read r;
  while (r.n < out.size()) {
    ERR_clear_error();
    size_t got = 0;
    int rc = SSL_read_ex(ssl_, out.data() + r.n, out.size() - r.n, &got);
    if (rc == 1) {
      r.n += got;
      continue;
    }
    int kind = SSL_get_error(ssl_, rc);
    if (kind == SSL_ERROR_WANT_READ || kind == SSL_ERROR_WANT_WRITE) break;
    if (kind == SSL_ERROR_ZERO_RETURN) {
      r.closed = true;
    } else {
      set_error_locked(rc);
      r.failed = true;
    }
    break;
  }
  return r;
}

int TlsSession::flush_locked(int fd) {
  for (;;) {
    char* p = nullptr;
    int n = BIO_nread0(network_, &p);
    if (n <= 0) return 0;
    ssize_t sent = ::send(fd, p, size_t(n), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return -errno;
    }
    BIO_nread(network_, &p, static_cast<int>(sent));
    if (sent < n) return 0;  // the socket is full
  }
}

int TlsSession::flush(int fd) {
  std::lock_guard lock(mu_);
  return flush_locked(fd);
}

bool TlsSession::output_pending() {
  std::lock_guard lock(mu_);
  return BIO_ctrl_pending(network_) > 0;
}

ssize_t TlsSession::write(int fd, const iovec* iov, size_t count) {
  std::lock_guard lock(mu_);
  BIO* out = SSL_get_wbio(ssl_);
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) total += iov[i].iov_len;
  size_t taken = 0, k = 0, off = 0;  // iov[k] + off: the next plaintext byte
  while (taken < total) {
    size_t room = BIO_ctrl_get_write_guarantee(out);
    if (room <= kRecordOverhead) {
      if (int rc = flush_locked(fd); rc < 0) return rc;
      room = BIO_ctrl_get_write_guarantee(out);
      if (room <= kRecordOverhead) break;  // the socket is full
    }
    // One record per SSL_write, never larger than the ring's free space: SSL_write then
    // always completes, so the session never holds a half-written record that a later call
    // would have to repeat with the same bytes.
    size_t chunk = std::min({kMaxRecord, room - kRecordOverhead, total - taken});
    while (iov[k].iov_len == off) {
      ++k;
      off = 0;
    }
    const void* p;
    if (iov[k].iov_len - off >= chunk) {  // a large part: straight from its memory
      p = static_cast<const std::byte*>(iov[k].iov_base) + off;
      off += chunk;
    } else {  // small pieces (frame heads, small parts): gathered into one record
      size_t filled = 0;
      while (filled < chunk) {
        size_t c = std::min(chunk - filled, iov[k].iov_len - off);
        std::memcpy(staging_.data() + filled, static_cast<const std::byte*>(iov[k].iov_base) + off,
                    c);
        filled += c;
        off += c;
        if (off == iov[k].iov_len && filled < chunk) {
          ++k;
          off = 0;
        }
      }
      p = staging_.data();
    }
    ERR_clear_error();
    size_t written = 0;
    int rc = SSL_write_ex(ssl_, p, chunk, &written);
    if (rc != 1 || written != chunk) {
      set_error_locked(rc);
      return -EPROTO;
    }
    taken += chunk;
  }
  if (int rc = flush_locked(fd); rc < 0) return rc;
  return ssize_t(taken);
}

std::string TlsSession::error() {
  std::lock_guard lock(mu_);
  return error_;
}

}  // namespace podium::channel::internal
