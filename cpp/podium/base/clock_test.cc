#include "podium/base/clock_timer.h"

#include <gtest/gtest.h>

#include <asio/io_context.hpp>
#include <memory>
#include <vector>

namespace podium::base {
namespace {

using namespace std::chrono_literals;

// CK-1: virtual time starts where it was made and moves only through advance().
TEST(ClockTest, ManualTimeMovesOnlyByAdvance) {
  ManualClock clock;
  auto t0 = clock.now();
  EXPECT_EQ(clock.now(), t0);
  clock.advance(10s);
  EXPECT_EQ(clock.now(), t0 + 10s);
  clock.advance(0s);
  EXPECT_EQ(clock.now(), t0 + 10s);
}

// CK-2: due waits run inside advance(), in expiry order, with now() at their expiry; a wait
// armed by a handler inside the window runs too; later ones wait.
TEST(ClockTest, AdvanceRunsDueWaitsInOrder) {
  asio::io_context io;
  auto clock = std::make_shared<ManualClock>();
  auto t0 = clock->now();
  std::vector<std::pair<int, Clock::time_point>> ran;
  Timer a(io, clock), b(io, clock), c(io, clock), chained(io, clock);
  a.expires_after(3s);
  a.async_wait([&](const std::error_code& ec) {
    ASSERT_FALSE(ec);
    ran.push_back({3, clock->now()});
    chained.expires_after(1s);  // due at t0 + 4 s, inside the window
    chained.async_wait([&](const std::error_code& ec) {
      ASSERT_FALSE(ec);
      ran.push_back({4, clock->now()});
    });
  });
  b.expires_after(1s);
  b.async_wait([&](const std::error_code& ec) {
    ASSERT_FALSE(ec);
    ran.push_back({1, clock->now()});
  });
  c.expires_after(10s);
  c.async_wait([&](const std::error_code&) { ran.push_back({10, clock->now()}); });
  EXPECT_EQ(clock->pending(), 3u);
  EXPECT_EQ(clock->advance(5s), 3u);
  ASSERT_EQ(ran.size(), 3u);
  EXPECT_EQ(ran[0], std::make_pair(1, t0 + 1s));
  EXPECT_EQ(ran[1], std::make_pair(3, t0 + 3s));
  EXPECT_EQ(ran[2], std::make_pair(4, t0 + 4s));
  EXPECT_EQ(clock->now(), t0 + 5s);
  EXPECT_EQ(clock->pending(), 1u);
  EXPECT_EQ(clock->advance(5s), 1u);
  EXPECT_EQ(ran.back(), std::make_pair(10, t0 + 10s));
  EXPECT_EQ(io.poll(), 0u);  // nothing was posted: the handlers ran in advance()
}

// CK-2: a wait armed in the past runs at the next advance, not inside async_wait().
TEST(ClockTest, PastExpiryRunsAtNextAdvance) {
  asio::io_context io;
  auto clock = std::make_shared<ManualClock>();
  Timer t(io, clock);
  bool ran = false;
  t.expires_at(clock->now() - 1s);
  t.async_wait([&](const std::error_code& ec) { ran = !ec; });
  EXPECT_FALSE(ran);
  clock->advance(0s);
  EXPECT_TRUE(ran);
}

// CK-3: a cancelled or re-armed wait never runs as expired; its handler hears
// operation_aborted on the io_context, not inside cancel().
TEST(ClockTest, CancelPostsAbortedHandler) {
  asio::io_context io;
  auto clock = std::make_shared<ManualClock>();
  Timer t(io, clock);
  std::vector<std::error_code> heard;
  t.expires_after(1s);
  t.async_wait([&](const std::error_code& ec) { heard.push_back(ec); });
  t.cancel();
  EXPECT_TRUE(heard.empty());
  EXPECT_EQ(clock->pending(), 0u);
  clock->advance(2s);
  EXPECT_TRUE(heard.empty());
  io.poll();
  ASSERT_EQ(heard.size(), 1u);
  EXPECT_EQ(heard[0], asio::error::operation_aborted);

  // A new expiry cancels the pending wait, as asio's does.
  t.expires_after(1s);
  t.async_wait([&](const std::error_code& ec) { heard.push_back(ec); });
  t.expires_after(5s);
  t.async_wait([&](const std::error_code& ec) { heard.push_back(ec); });
  clock->advance(2s);
  io.restart();
  io.poll();
  ASSERT_EQ(heard.size(), 2u);
  EXPECT_EQ(heard[1], asio::error::operation_aborted);
  clock->advance(3s);
  ASSERT_EQ(heard.size(), 3u);
  EXPECT_FALSE(heard[2]);
}

// CK-3: a wait still pending when its io_context goes is destroyed unrun, and what its
// handler held is released (no cycle through the clock keeps it).
TEST(ClockTest, PendingWaitDiesWithItsIoContext) {
  auto clock = std::make_shared<ManualClock>();
  auto held = std::make_shared<int>(7);
  std::weak_ptr<int> watch = held;
  {
    asio::io_context io;
    auto t = std::make_shared<Timer>(io, clock);
    t->expires_after(1s);
    t->async_wait([t, held](const std::error_code&) {});  // holds its own timer: a cycle
    held.reset();
    t.reset();
  }
  EXPECT_TRUE(watch.expired());
  EXPECT_EQ(clock->pending(), 0u);
  EXPECT_EQ(clock->advance(2s), 0u);
}

// CK-4: with no clock, a Timer is an asio timer on the real clock.
TEST(ClockTest, NullClockIsTheRealSteadyClock) {
  asio::io_context io;
  Timer t(io);
  auto before = std::chrono::steady_clock::now();
  EXPECT_GE(t.now(), before);
  bool ran = false;
  t.expires_after(1ms);
  t.async_wait([&](const std::error_code& ec) { ran = !ec; });
  io.run();  // returns once the timer fired
  EXPECT_TRUE(ran);
  EXPECT_GE(std::chrono::steady_clock::now() - before, 1ms);
}

}  // namespace
}  // namespace podium::base
