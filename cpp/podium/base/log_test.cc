#include "podium/base/log.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/stdout_sinks.h>

namespace podium::base {
namespace {

using namespace std::chrono_literals;

TEST(BaseLog, RateLimitedLogLetsABurstThroughPerIntervalAndCountsTheRest) {  // BL-2
  RateLimitedLog limit(1s, 3);
  auto t0 = RateLimitedLog::Clock::now();
  uint64_t held = 99;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(limit.allow(held, t0 + i * 1ms));
    EXPECT_EQ(held, 0u);
  }
  for (int i = 0; i < 7; ++i) EXPECT_FALSE(limit.allow(held, t0 + 500ms));
  EXPECT_EQ(limit.total_suppressed(), 7u);
  // The next interval lets lines through again, the first one reporting the 7 held back.
  ASSERT_TRUE(limit.allow(held, t0 + 1001ms));
  EXPECT_EQ(held, 7u);
  ASSERT_TRUE(limit.allow(held, t0 + 1002ms));
  EXPECT_EQ(held, 0u);
}

TEST(BaseLog, InitLoggingSendsTheDefaultLoggerToStderr) {  // BL-1
  spdlog::set_level(spdlog::level::debug);
  init_logging();
  auto logger = spdlog::default_logger();
  ASSERT_EQ(logger->sinks().size(), 1u);
  EXPECT_NE(std::dynamic_pointer_cast<spdlog::sinks::stderr_sink_mt>(logger->sinks()[0]), nullptr);
  EXPECT_EQ(logger->level(), spdlog::level::debug);  // the level is kept
  // Captured: the line goes to fd 2, nothing to fd 1.
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  spdlog::warn("to stderr");
  spdlog::default_logger()->flush();
  std::string out = ::testing::internal::GetCapturedStdout();
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out, "");
  EXPECT_NE(err.find("to stderr"), std::string::npos);
}

}  // namespace
}  // namespace podium::base
