#include "podium/actor/executor.h"

#include <gtest/gtest.h>

#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <thread>
#include <atomic>

#include "podium/actor/signal.h"

namespace podium::actor {
namespace {

using namespace std::chrono_literals;

TEST(Executor, ALongHandlerDoesNotStallOtherWork) {  // AC-2
  asio::io_context io;
  Executor ex(io);
  ex.start();
  Signal release, quick_done;
  asio::post(io, [&] {
    ex.handler_begin();
    release.wait_for(10s);  // a handler that runs "forever" without saying it blocks
    ex.handler_end();
  });
  asio::post(io, [&] { quick_done.set(); });
  // The watchdog adds a runner within a few ticks of 2 ms.
  EXPECT_TRUE(quick_done.wait_for(2s));
  EXPECT_GE(ex.runner_count(), 2u);
  release.set();
  ex.stop();
}

TEST(Executor, ABlockingWaitHandsOffAtOnce) {  // AC-2 via BlockingScope
  asio::io_context io;
  Executor ex(io);
  ex.start();
  Signal reply, done;
  asio::post(io, [&] {
    // Waiting on a Signal inside a runner marks it blocked and adds a runner first, so the
    // work that sets the signal can run.
    asio::post(io, [&] { reply.set(); });
    EXPECT_TRUE(reply.wait_for(5s));
    done.set();
  });
  EXPECT_TRUE(done.wait_for(5s));
  ex.stop();
}

TEST(Executor, SurplusRunnersRetire) {
  asio::io_context io;
  Executor ex(io);
  ex.start();
  Signal release, started;
  asio::post(io, [&] {
    ex.handler_begin();
    started.set();
    release.wait_for(10s);
    ex.handler_end();
  });
  ASSERT_TRUE(started.wait_for(2s));
  auto deadline = std::chrono::steady_clock::now() + 2s;
  while (ex.runner_count() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_GE(ex.runner_count(), 2u);
  release.set();
  // Give runners work to notice they are surplus.
  deadline = std::chrono::steady_clock::now() + 2s;
  while (ex.runner_count() > 1 && std::chrono::steady_clock::now() < deadline) {
    asio::post(io, [] {});
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(ex.runner_count(), 1u);
  ex.stop();  // AC-3
}

TEST(Executor, AnUntimedWaitDrivesTheLoopThenHandsItBack) {
  asio::io_context io;
  Executor ex(io);
  ex.start();
  Executor::set_drivable(&ex);
  std::atomic<std::thread::id> ran_on{};
  Signal done;
  // The completion lands well after the primary runner has stepped aside.
  asio::steady_timer timer(io, 50ms);
  timer.async_wait([&](const std::error_code&) {
    ran_on = std::this_thread::get_id();
    done.set();
  });
  done.wait();  // untimed, outside the runtime: this thread runs the loop
  EXPECT_EQ(ran_on.load(), std::this_thread::get_id());
  // Once no caller drives, the primary takes the loop back: work runs with nobody waiting.
  Signal later;
  std::this_thread::sleep_for(5ms);
  asio::post(io, [&] { later.set(); });
  EXPECT_TRUE(later.wait_for(2s));  // timed: does not drive
  Executor::set_drivable(nullptr);
  ex.stop();
}

TEST(Executor, DriveOrWaitTakesTheLoopOverWhenTheDriverLeaves) {
  asio::io_context io;
  Executor ex(io);
  ex.start();
  Signal first_driving, release_first, second_done;
  std::atomic<std::thread::id> ran_on{};
  // The first thread drives until released.
  std::thread first([&] {
    ex.drive([&] {
      first_driving.set();
      return release_first.is_set();
    }, std::chrono::steady_clock::now() + 10s);
  });
  ASSERT_TRUE(first_driving.wait_for(5s));
  std::atomic<bool> got{false};
  std::thread second([&] {
    got = ex.drive_or_wait([&] { return second_done.is_set(); },
                           std::chrono::steady_clock::now() + 10s);
  });
  std::this_thread::sleep_for(20ms);  // the second thread now waits for the loop
  release_first.set();
  asio::post(io, [] {});  // ends the first driver's run_one
  first.join();
  // The work lands after the first driver left, well inside the primary's 1 ms grace only
  // if the second thread took the loop over; either way it must run and end the wait.
  asio::post(io, [&] {
    ran_on = std::this_thread::get_id();
    second_done.set();
  });
  second.join();
  EXPECT_TRUE(got.load());
  ex.stop();
}

TEST(Executor, DriveOrWaitEndsWhenAProducerWakesIt) {
  asio::io_context io;
  Executor ex(io);
  ex.start();
  Signal first_driving, release_first;
  std::thread first([&] {
    ex.drive([&] {
      first_driving.set();
      return release_first.is_set();
    }, std::chrono::steady_clock::now() + 10s);
  });
  ASSERT_TRUE(first_driving.wait_for(5s));
  std::atomic<bool> flag{false};
  std::atomic<bool> got{false};
  std::thread second([&] {
    got = ex.drive_or_wait([&] { return flag.load(); }, std::chrono::steady_clock::now() + 10s);
  });
  std::this_thread::sleep_for(20ms);
  auto t0 = std::chrono::steady_clock::now();
  flag = true;  // made true by another thread while the first still drives
  ex.wake_waiters();
  second.join();
  EXPECT_TRUE(got.load());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  release_first.set();
  asio::post(io, [] {});
  first.join();
  ex.stop();
}

TEST(Executor, AfterHandBackThePrimaryRunsTheLoop) {
  asio::io_context io;
  Executor ex(io);
  ex.start();
  Signal drove;
  asio::steady_timer timer(io, 20ms);  // lands after the primary stepped aside
  timer.async_wait([&](const std::error_code&) { drove.set(); });
  ASSERT_TRUE(ex.drive([&] { return drove.is_set(); }, std::chrono::steady_clock::now() + 5s));
  ex.hand_back();
  Signal later;
  std::atomic<std::thread::id> ran_on{};
  asio::post(io, [&] {
    ran_on = std::this_thread::get_id();
    later.set();
  });
  EXPECT_TRUE(later.wait_for(2s));  // timed: does not drive
  EXPECT_NE(ran_on.load(), std::this_thread::get_id());
  ex.stop();
}

}  // namespace
}  // namespace podium::actor
