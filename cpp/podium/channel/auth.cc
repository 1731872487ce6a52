#include "podium/channel/auth.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>

#include "podium/channel/net.h"

namespace podium::channel::internal {
namespace {

constexpr uint8_t kMagic[4] = {'P', 'D', 'M', 'A'};
constexpr uint8_t kVersion = 1;
constexpr std::string_view kDiallerLabel = "podium-auth-1 dialler";
constexpr std::string_view kListenerLabel = "podium-auth-1 listener";

// What OpenSSL's error queue says about the call that just failed on this thread.
std::string openssl_reason() {
  unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no reason given";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

Result<std::array<uint8_t, 32>> mac(const std::string& secret, std::string_view label,
                                    const Nonce& a, const Nonce& b) {
  uint8_t data[64 + 32];
  size_t n = 0;
  std::memcpy(data, label.data(), label.size());
  n += label.size();
  std::memcpy(data + n, a.data(), a.size());
  n += a.size();
  std::memcpy(data + n, b.data(), b.size());
  n += b.size();
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), data, n, out.data(),
            &len) ||
      len != out.size()) {
    return std::unexpected(make_error(ChannelErrc::kAuthFailed,
                                      "authentication: HMAC-SHA256 failed (OpenSSL: " +
                                          openssl_reason() + ")"));
  }
  return out;
}

}  // namespace

Result<Nonce> random_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
    return std::unexpected(make_error(ChannelErrc::kAuthFailed,
                                      "authentication: no random bytes for a nonce (OpenSSL: " +
                                          openssl_reason() + ")"));
  }
  return n;
}

std::array<uint8_t, kChallengeBytes> auth_challenge(const Nonce& server_nonce) {
  std::array<uint8_t, kChallengeBytes> out{};
  std::memcpy(out.data(), kMagic, 4);
  out[4] = kVersion;
  std::memcpy(out.data() + 5, server_nonce.data(), server_nonce.size());
  return out;
}

bool parse_challenge(std::span<const uint8_t> bytes, Nonce& server_nonce) {
  if (bytes.size() != kChallengeBytes || std::memcmp(bytes.data(), kMagic, 4) != 0 ||
      bytes[4] != kVersion) {
    return false;
  }
  std::memcpy(server_nonce.data(), bytes.data() + 5, server_nonce.size());
  return true;
}

Result<Response> auth_response(const std::string& secret, const Nonce& server_nonce,
                               const Nonce& client_nonce) {
  auto m = mac(secret, kDiallerLabel, server_nonce, client_nonce);
  if (!m) return std::unexpected(std::move(m.error()));
  Response out{};
  std::memcpy(out.data(), client_nonce.data(), 32);
  std::memcpy(out.data() + 32, m->data(), 32);
  return out;
}

Result<bool> verify_response(const std::string& secret, const Nonce& server_nonce,
                             std::span<const uint8_t> bytes, Nonce& client_nonce) {
  if (bytes.size() != kResponseBytes) return false;
  std::memcpy(client_nonce.data(), bytes.data(), 32);
  auto want = mac(secret, kDiallerLabel, server_nonce, client_nonce);
  if (!want) return std::unexpected(std::move(want.error()));
  return CRYPTO_memcmp(want->data(), bytes.data() + 32, 32) == 0;
}

Result<VerdictBytes> auth_verdict(bool accepted, const std::string& secret,
                                  const Nonce& client_nonce, const Nonce& server_nonce) {
  VerdictBytes out{};
  if (!accepted) return out;
  auto m = mac(secret, kListenerLabel, client_nonce, server_nonce);
  if (!m) return std::unexpected(std::move(m.error()));
  out[0] = 1;
  std::memcpy(out.data() + 1, m->data(), 32);
  return out;
}

Result<Verdict> check_verdict(const std::string& secret, const Nonce& client_nonce,
                              const Nonce& server_nonce, std::span<const uint8_t> bytes) {
  if (bytes.size() != kVerdictBytes) return Verdict::kForged;
  if (bytes[0] == 0) return Verdict::kRefused;
  if (bytes[0] != 1) return Verdict::kForged;
  auto want = mac(secret, kListenerLabel, client_nonce, server_nonce);
  if (!want) return std::unexpected(std::move(want.error()));
  return CRYPTO_memcmp(want->data(), bytes.data() + 1, 32) == 0 ? Verdict::kAccepted
                                                                : Verdict::kForged;
}

}  // namespace podium::channel::internal
