// Internal to podium_channel: the challenge-response that a TCP connection passes before any
// frame is read (CH-8, docs/channel.md).
//
// Both ends hold the job's shared secret. On accept, the listener sends a challenge with a
// fresh random nonce; the dialler answers with its own nonce and an HMAC-SHA256 over both
// under the secret; the listener checks it (in constant time) and answers with its verdict
// and, when it accepts, an HMAC proving that it holds the secret too. Only then does the
// dialler send its Hello, and only then does the listener decode frames, so nothing is
// unpickled from a peer that does not know the secret. Each proof binds both nonces and a
// direction label, so a recorded exchange cannot be replayed, and one side's proof cannot
// be reflected as the other's.
//
//   challenge  "PDMA" 0x01 nonce_s[32]                     (listener -> dialler, 37 bytes)
//   response   nonce_c[32] HMAC(secret, "podium-auth-1 dialler" nonce_s nonce_c)[32]
//   verdict    0x01 HMAC(secret, "podium-auth-1 listener" nonce_c nonce_s)[32], or 0x00 x 33
//
// Threads: pure functions, callable from any thread. Errors are values: when OpenSSL gives no
// random bytes or no HMAC, the function returns ChannelErrc::kAuthFailed saying which, and
// the connection that needed it closes with that reason (counted in NetStats::setup_errors).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "podium/base/error.h"

namespace podium::channel::internal {

using Nonce = std::array<uint8_t, 32>;
constexpr size_t kChallengeBytes = 37;
constexpr size_t kResponseBytes = 64;
constexpr size_t kVerdictBytes = 33;
// Raw bytes each side waits for at most this long before it drops the connection.
constexpr auto kAuthTimeout = std::chrono::seconds(10);

[[nodiscard]] Result<Nonce> random_nonce();

std::array<uint8_t, kChallengeBytes> auth_challenge(const Nonce& server_nonce);
// False when `bytes` is not a podium challenge.
bool parse_challenge(std::span<const uint8_t> bytes, Nonce& server_nonce);

using Response = std::array<uint8_t, kResponseBytes>;
[[nodiscard]] Result<Response> auth_response(const std::string& secret, const Nonce& server_nonce,
                                             const Nonce& client_nonce);
// True when `bytes` proves the secret for this challenge; sets the dialler's nonce.
[[nodiscard]] Result<bool> verify_response(const std::string& secret, const Nonce& server_nonce,
                                           std::span<const uint8_t> bytes, Nonce& client_nonce);

using VerdictBytes = std::array<uint8_t, kVerdictBytes>;
[[nodiscard]] Result<VerdictBytes> auth_verdict(bool accepted, const std::string& secret,
                                                const Nonce& client_nonce,
                                                const Nonce& server_nonce);
enum class Verdict : uint8_t { kAccepted, kRefused, kForged };
[[nodiscard]] Result<Verdict> check_verdict(const std::string& secret, const Nonce& client_nonce,
                                            const Nonce& server_nonce,
                                            std::span<const uint8_t> bytes);

}  // namespace podium::channel::internal
