#include "podium/channel/auth.h"

#include <gtest/gtest.h>

namespace podium::channel::internal {
namespace {

TEST(Auth, AResponseVerifiesOnlyUnderTheSameSecretAndChallenge) {
  Nonce s = random_nonce(), c = random_nonce(), other = random_nonce();
  auto challenge = auth_challenge(s);
  Nonce parsed{};
  ASSERT_TRUE(parse_challenge(challenge, parsed));
  EXPECT_EQ(parsed, s);
  auto response = auth_response("secret", s, c);
  Nonce got{};
  EXPECT_TRUE(verify_response("secret", s, response, got));
  EXPECT_EQ(got, c);
  EXPECT_FALSE(verify_response("Secret", s, response, got));  // another secret
  EXPECT_FALSE(verify_response("secret", other, response, got));  // replayed to a new challenge
  auto tampered = response;
  tampered[40] ^= 1;
  EXPECT_FALSE(verify_response("secret", s, tampered, got));
}

TEST(Auth, AVerdictProvesTheListenerAndCannotBeReflected) {
  Nonce s = random_nonce(), c = random_nonce();
  auto ok = auth_verdict(true, "secret", c, s);
  EXPECT_EQ(check_verdict("secret", c, s, ok), Verdict::kAccepted);
  EXPECT_EQ(check_verdict("other", c, s, ok), Verdict::kForged);
  EXPECT_EQ(check_verdict("secret", c, random_nonce(), ok), Verdict::kForged);
  EXPECT_EQ(check_verdict("secret", c, s, auth_verdict(false, "secret", c, s)), Verdict::kRefused);
  // The dialler's own proof, sent back as if it were the listener's, does not pass.
  auto response = auth_response("secret", s, c);
  std::array<uint8_t, kVerdictBytes> reflected{};
  reflected[0] = 1;
  std::copy(response.begin() + 32, response.end(), reflected.begin() + 1);
  EXPECT_EQ(check_verdict("secret", c, s, reflected), Verdict::kForged);
}

TEST(Auth, ChallengesAreFreshAndTyped) {
  EXPECT_NE(random_nonce(), random_nonce());
  std::array<uint8_t, kChallengeBytes> junk{};
  Nonce n{};
  EXPECT_FALSE(parse_challenge(junk, n));
}

}  // namespace
}  // namespace podium::channel::internal
