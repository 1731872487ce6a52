// Fuzz target: what a listener or a dialler parses of the raw bytes before TLS or frames
// (channel/auth.h, channel/tls.h): the CH-8 challenge, response and verdict, and the CH-9
// greeting and notice. All have fixed sizes; the target checks that no input is accepted
// that should not be (a response or verdict that verifies only under the secret's MAC).
#include "fuzz.h"
#include "podium/channel/auth.h"
#include "podium/channel/tls.h"

using namespace podium::channel::internal;

const char* const podium::fuzz::kTargetName = "auth";

namespace {
const std::string kSecret = "fuzz-secret";
const Nonce kServer = [] {
  Nonce n{};
  for (size_t i = 0; i < n.size(); ++i) n[i] = uint8_t(i * 7 + 1);
  return n;
}();
const Nonce kClient = [] {
  Nonce n{};
  for (size_t i = 0; i < n.size(); ++i) n[i] = uint8_t(i * 13 + 5);
  return n;
}();
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::span<const uint8_t> b(data + 1, size - 1);
  switch (data[0] % 5) {
    case 0: {
      Nonce n{};
      if (parse_challenge(b, n)) PODIUM_FUZZ_CHECK(b.size() == kChallengeBytes);
      break;
    }
    case 1: {
      Nonce client{};
      auto ok = verify_response(kSecret, kServer, b, client);
      PODIUM_FUZZ_CHECK(ok.has_value());
      if (*ok) {
        auto want = auth_response(kSecret, kServer, client);
        PODIUM_FUZZ_CHECK(want.has_value());
        PODIUM_FUZZ_CHECK(std::equal(want->begin(), want->end(), b.begin(), b.end()));
      }
      break;
    }
    case 2: {
      auto v = check_verdict(kSecret, kClient, kServer, b);
      PODIUM_FUZZ_CHECK(v.has_value());
      if (*v == Verdict::kAccepted) {
        auto want = auth_verdict(true, kSecret, kClient, kServer);
        PODIUM_FUZZ_CHECK(want.has_value());
        PODIUM_FUZZ_CHECK(std::equal(want->begin(), want->end(), b.begin(), b.end()));
      }
      break;
    }
    case 3:
      (void)classify_greeting(b);
      break;
    default:
      if (!b.empty()) (void)looks_like_tls(std::as_bytes(b));
  }
  return 0;
}

std::vector<podium::fuzz::Input> podium::fuzz::seeds() {
  std::vector<Input> out;
  auto with = [&](uint8_t which, std::span<const uint8_t> b) {
    Input in{which};
    in.insert(in.end(), b.begin(), b.end());
    out.push_back(std::move(in));
  };
  with(0, auth_challenge(kServer));
  with(1, auth_response(kSecret, kServer, kClient).value());
  with(2, auth_verdict(true, kSecret, kClient, kServer).value());
  with(2, auth_verdict(false, kSecret, kClient, kServer).value());
  with(3, tls_greeting());
  with(3, plaintext_notice());
  with(3, auth_challenge(kServer));
  const uint8_t client_hello[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03};
  with(4, client_hello);
  return out;
}
