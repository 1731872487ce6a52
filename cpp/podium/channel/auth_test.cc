#include "podium/channel/auth.h"

#include <gtest/gtest.h>

namespace podium::channel::internal {
namespace {

// The functions return values; a failed one (no random bytes, no HMAC) fails the test.
Nonce nonce() {
  auto n = random_nonce();
  EXPECT_TRUE(n) << n.error().to_string();
  return n.value_or(Nonce{});
}

TEST(Auth, AResponseVerifiesOnlyUnderTheSameSecretAndChallenge) {  // CH-8
  Nonce s = nonce(), c = nonce(), other = nonce();
  auto challenge = auth_challenge(s);
  Nonce parsed{};
  ASSERT_TRUE(parse_challenge(challenge, parsed));
  EXPECT_EQ(parsed, s);
  auto response = auth_response("secret", s, c);
  ASSERT_TRUE(response);
  Nonce got{};
  EXPECT_EQ(verify_response("secret", s, *response, got), true);
  EXPECT_EQ(got, c);
  EXPECT_EQ(verify_response("Secret", s, *response, got), false);  // another secret
  EXPECT_EQ(verify_response("secret", other, *response, got), false);  // replayed
  auto tampered = *response;
  tampered[40] ^= 1;
  EXPECT_EQ(verify_response("secret", s, tampered, got), false);
  EXPECT_EQ(verify_response("secret", s, std::span(tampered).first(10), got), false);
}

TEST(Auth, AVerdictProvesTheListenerAndCannotBeReflected) {  // CH-8
  Nonce s = nonce(), c = nonce();
  auto ok = auth_verdict(true, "secret", c, s);
  ASSERT_TRUE(ok);
  EXPECT_EQ(check_verdict("secret", c, s, *ok), Verdict::kAccepted);
  EXPECT_EQ(check_verdict("other", c, s, *ok), Verdict::kForged);
  EXPECT_EQ(check_verdict("secret", c, nonce(), *ok), Verdict::kForged);
  auto no = auth_verdict(false, "secret", c, s);
  ASSERT_TRUE(no);
  EXPECT_EQ(check_verdict("secret", c, s, *no), Verdict::kRefused);
  // The dialler's own proof, sent back as if it were the listener's, does not pass.
  auto response = auth_response("secret", s, c);
  ASSERT_TRUE(response);
  VerdictBytes reflected{};
  reflected[0] = 1;
  std::copy(response->begin() + 32, response->end(), reflected.begin() + 1);
  EXPECT_EQ(check_verdict("secret", c, s, reflected), Verdict::kForged);
}

TEST(Auth, ChallengesAreFreshAndTyped) {
  EXPECT_NE(nonce(), nonce());
  std::array<uint8_t, kChallengeBytes> junk{};
  Nonce n{};
  EXPECT_FALSE(parse_challenge(junk, n));
}

}  // namespace
}  // namespace podium::channel::internal
