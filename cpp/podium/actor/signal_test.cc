#include "podium/actor/signal.h"

#include <gtest/gtest.h>

#include <thread>

#include "podium/actor/future.h"

namespace podium::actor {
namespace {

using namespace std::chrono_literals;

TEST(Signal, WaitForTimesOutWhenUnset) {  // AC-15
  Signal s;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(s.wait_for(20ms));
  auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, 20ms);
  EXPECT_LT(waited, 2s);
}

TEST(Signal, SetFromAnotherThreadWakesASleeper) {  // AC-1
  Signal::set_spin(0ns);  // force the futex path
  Signal s;
  std::thread t([&] {
    std::this_thread::sleep_for(10ms);
    s.set();
  });
  EXPECT_TRUE(s.wait_for(5s));
  EXPECT_TRUE(s.wait_for(0ns));  // stays set
  t.join();
  Signal::set_spin(50us);
}

TEST(Future, GetWithTimeoutDoesNotConsumeTheValue) {
  Promise<int> p;
  auto f = p.future();
  auto first = f.get(1ms);
  ASSERT_FALSE(first);
  EXPECT_TRUE(first.error().is(ActorErrc::kTimeout));
  p.set(42);
  EXPECT_EQ(*f.get(1s), 42);
  EXPECT_EQ(*f.get(), 42);  // repeated gets see the same value
}

TEST(Future, SecondSetIsIgnoredAndCallbacksRunOnce) {  // AC-4
  Promise<int> p;
  auto f = p.future();
  int calls = 0;
  f.on_ready([&](const Result<int>& r) {
    ++calls;
    EXPECT_EQ(*r, 1);
  });
  EXPECT_TRUE(p.set(1));
  EXPECT_FALSE(p.set(2));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(*f.get(), 1);
  f.on_ready([&](const Result<int>&) { ++calls; });  // registered late: runs at once
  EXPECT_EQ(calls, 2);
}

TEST(Future, AbandonedPromiseCancels) {  // AC-5
  Future<int> f;
  {
    Promise<int> p;
    f = p.future();
  }
  auto r = f.get(1s);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(BaseErrc::kCancelled));
}

}  // namespace
}  // namespace podium::actor
