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
  ASSERT_TRUE(g.may_start(t));
  g.start(t);
  for (int i = 0; i < 1000; ++i) {
    t += 2us;
    EXPECT_TRUE(g.check(t));
  }
  EXPECT_EQ(g.preemptions(), 0u);
  EXPECT_TRUE(g.may_start(t));
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
  EXPECT_FALSE(g.may_start(lost));
  EXPECT_FALSE(g.may_start(lost + BusyWaitGuard::kBackoff - 1ns));
  EXPECT_TRUE(g.may_start(lost + BusyWaitGuard::kBackoff));  // then it tries again
}

TEST(BusyWaitGuard, EachThreadHasItsOwn) {  // AC-19: a thread's backoff is its own
  BusyWaitGuard& here = BusyWaitGuard::mine();
  auto t = Clock::now();
  here.start(t);
  ASSERT_FALSE(here.check(t + 1s));
  EXPECT_FALSE(here.may_start(t + 1s));
  bool other_may = false;
  std::thread([&] { other_may = BusyWaitGuard::mine().may_start(t + 1s); }).join();
  EXPECT_TRUE(other_may);
  EXPECT_EQ(&BusyWaitGuard::mine(), &here);
}

}  // namespace
}  // namespace podium::actor
