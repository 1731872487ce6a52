// BusyWaitGuard (busy_wait.h): the decision to stop polling or spinning, on synthetic times.
#include "podium/actor/busy_wait.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace podium::actor {
namespace {

using namespace std::chrono_literals;
using Clock = BusyWaitGuard::Clock;

TEST(BusyWaitGuard, ChecksCloseTogetherKeepTheWaitGoing) {  // AC-19
  BusyWaitGuard g;
  auto t = Clock::time_point{} + 1h;
  ASSERT_FALSE(g.backing_off(t));
  g.start(t);
  for (int i = 0; i < 1000; ++i) {
    t += 2us;
    EXPECT_TRUE(g.check(t));
  }
  EXPECT_EQ(g.preemptions(), 0u);
  EXPECT_FALSE(g.backing_off(t));
}

TEST(BusyWaitGuard, AGapEndsTheWaitAndNoBusyWaitStartsDuringTheBackoff) {  // AC-19
  BusyWaitGuard g;
  auto t = Clock::time_point{} + 1h;
  g.start(t);
  EXPECT_TRUE(g.check(t + BusyWaitGuard::kPreemptedGap));  // exactly the gap: not preempted
  t += BusyWaitGuard::kPreemptedGap;
  auto lost = t + BusyWaitGuard::kPreemptedGap + 1ns;  // the core was lost in between
  EXPECT_FALSE(g.check(lost));
  EXPECT_EQ(g.preemptions(), 1u);
  EXPECT_TRUE(g.backing_off(lost));
  EXPECT_TRUE(g.backing_off(lost + BusyWaitGuard::kBackoff - 1ns));
  EXPECT_FALSE(g.backing_off(lost + BusyWaitGuard::kBackoff));  // then it tries again
}

TEST(BusyWaitGuard, EachThreadHasItsOwn) {  // AC-19: a thread's backoff is its own
  BusyWaitGuard& here = BusyWaitGuard::mine();
  auto t = Clock::now();
  here.start(t);
  ASSERT_FALSE(here.check(t + 1s));
  EXPECT_TRUE(here.backing_off(t + 1s));
  bool other_may = false;
  std::thread([&] { other_may = !BusyWaitGuard::mine().backing_off(t + 1s); }).join();
  EXPECT_TRUE(other_may);
  EXPECT_EQ(&BusyWaitGuard::mine(), &here);
}

TEST(BusyWaitGuard, ReadsTheRunnableCountOfALoadavgLine) {  // AC-20
  EXPECT_EQ(BusyWaitGuard::runnable_of("0.00 0.01 0.05 3/123 4567\n"), 3u);
  EXPECT_EQ(BusyWaitGuard::runnable_of("12.50 8.00 4.00 17/2048 99"), 17u);
  EXPECT_EQ(BusyWaitGuard::runnable_of(""), std::nullopt);
  EXPECT_EQ(BusyWaitGuard::runnable_of("0.00 0.01 0.05"), std::nullopt);
  EXPECT_EQ(BusyWaitGuard::runnable_of("0.00 0.01 0.05 x/123 1"), std::nullopt);
  EXPECT_EQ(BusyWaitGuard::runnable_of("0.00 0.01 0.05 3 1"), std::nullopt);
}

TEST(BusyWaitGuard, BusyWaitsOnlyWithACoreToSpare) {  // AC-20
  EXPECT_TRUE(BusyWaitGuard::spare(1, 2));
  EXPECT_TRUE(BusyWaitGuard::spare(2, 2));  // the two ends of an exchange, one core each
  EXPECT_FALSE(BusyWaitGuard::spare(3, 2));
  EXPECT_FALSE(BusyWaitGuard::spare(9, 8));
  // The process-wide verdict is taken from this machine: a boolean, cached for kLoadCheck.
  auto now = Clock::now();
  bool first = BusyWaitGuard::cores_to_spare(now);
  EXPECT_EQ(BusyWaitGuard::cores_to_spare(now + 1ms), first);
}

}  // namespace
}  // namespace podium::actor
