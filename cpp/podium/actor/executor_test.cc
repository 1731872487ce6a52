#include "podium/actor/executor.h"

#include <gtest/gtest.h>

#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "podium/actor/signal.h"
#include "podium/channel/test_util.h"

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
  using channel::testing::eventually;
  ASSERT_TRUE(eventually([&] { return ex.runner_count() >= 2; }, 2s)) << ex.runner_count();
  release.set();
  // Give runners work to notice they are surplus.
  EXPECT_TRUE(eventually(
      [&] {
        if (ex.runner_count() <= 1) return true;
        asio::post(io, [] {});
        return false;
      },
      2s));
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
  // The completion lands well after the primary runner has stepped aside (generously: a
  // loaded machine may not schedule it for tens of milliseconds).
  asio::steady_timer timer(io, 300ms);
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

// The voluntary context switches of this process's threads but the caller's.
long switches_but(pid_t skip) {
  long n = 0;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
    if (t.path().filename() == std::to_string(skip)) continue;
    std::ifstream in(t.path() / "status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) n += std::stol(line.substr(24));
    }
  }
  return n;
}

TEST(Executor, AParkedRunnerSleepsWhileACallerDrives) {  // AC-22
  asio::io_context io;
  Executor ex(io);
  ex.start();
  Signal driving, release;
  std::atomic<pid_t> driver_tid{0};
  std::thread driver([&] {
    driver_tid = static_cast<pid_t>(::gettid());
    ex.drive([&] {
      if (Executor::current() == &ex) driving.set();
      return release.is_set();
    }, std::chrono::steady_clock::now() + 10s);
  });
  ASSERT_TRUE(driving.wait_for(5s));
  std::this_thread::sleep_for(200ms);  // the watchdog parks after 100 ms without handlers
  long before = switches_but(driver_tid.load());
  std::this_thread::sleep_for(500ms);
  long during = switches_but(driver_tid.load()) - before;
  // This thread's own sleep and the read of /proc are a handful; a runner waking every
  // kReclaimAfter (1 ms) would make about 500.
  EXPECT_LT(during, 50);
  release.set();
  asio::post(io, [] {});
  driver.join();
  // Released: the primary takes the loop back (kReclaimAfter later) and runs what comes.
  Signal ran;
  asio::post(io, [&] { ran.set(); });
  EXPECT_TRUE(ran.wait_for(5s));
  ex.stop();
}

TEST(Executor, ACallerDrivingCallAfterCallDoesNotWakeTheParkedRunnerEachTime) {  // AC-22
  asio::io_context io;
  Executor ex(io);
  ex.start();
  pid_t me = static_cast<pid_t>(::gettid());
  bool drove = false;
  ex.drive([&] { return drove = drove || Executor::current() == &ex; },
           std::chrono::steady_clock::now() + 5s);
  ASSERT_TRUE(drove);  // the primary parked, and this thread ran the loop
  std::this_thread::sleep_for(200ms);  // the watchdog parks after 100 ms without handlers
  long before = switches_but(me);
  auto t0 = std::chrono::steady_clock::now();
  int n = 0;
  for (; n < 500; ++n) {  // calls 100 us apart, each answered at the caller's first look
    ex.drive([] { return true; }, std::chrono::steady_clock::now() + 5s);
    std::this_thread::sleep_for(100us);
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now() - t0).count();
  long during = switches_but(me) - before;
  // At most one wake of the primary per kReclaimAfter (1 ms) of driving, not one per release.
  EXPECT_LT(during, ms + 50) << n << " drives in " << ms << " ms";
  Signal ran;
  asio::post(io, [&] { ran.set(); });
  EXPECT_TRUE(ran.wait_for(5s));
  ex.stop();
}

TEST(Executor, OneReleaseWakesOneWaiterOldestFirst) {
  asio::io_context io;
  Executor ex(io);
  ex.start();
  Signal driving, release;
  std::thread driver([&] {
    ex.drive([&] {
      if (Executor::current() == &ex) driving.set();  // the loop is this thread's now
      return release.is_set();
    }, std::chrono::steady_clock::now() + 10s);
  });
  ASSERT_TRUE(driving.wait_for(5s));
  std::atomic<int> woken_first{0}, woken_second{0};
  uint64_t first = ex.on_release([&] { woken_first++; });
  uint64_t second = ex.on_release([&] { woken_second++; });
  ASSERT_NE(first, 0u);  // the loop is driven: both wait
  ASSERT_NE(second, 0u);
  release.set();
  asio::post(io, [] {});  // ends the driver's run_one
  driver.join();
  EXPECT_EQ(woken_first.load(), 1);
  EXPECT_EQ(woken_second.load(), 0);  // no thundering herd
  ex.cancel_release(second);
  EXPECT_EQ(ex.on_release([] {}), 0u);  // released and parked: free to take now
  ex.stop();
}

TEST(Executor, AWokenWaiterTakesTheLoopOver) {
  asio::io_context io;
  Executor ex(io);
  ex.start();
  Signal driving, release, taken;
  std::thread driver([&] {
    ex.drive([&] {
      if (Executor::current() == &ex) driving.set();
      return release.is_set();
    }, std::chrono::steady_clock::now() + 10s);
  });
  ASSERT_TRUE(driving.wait_for(5s));
  Signal woken, done, registered;
  std::atomic<std::thread::id> ran_on{};
  std::thread waiter([&] {
    uint64_t token = ex.on_release([&] { woken.set(); });
    registered.set();
    ASSERT_NE(token, 0u);
    ASSERT_TRUE(woken.wait_for(5s));
    // Taking over: the work posted below runs on this thread.
    EXPECT_TRUE(ex.drive([&] { return done.is_set(); }, std::chrono::steady_clock::now() + 5s));
    taken.set();
  });
  ASSERT_TRUE(registered.wait_for(5s));
  release.set();
  asio::post(io, [] {});
  driver.join();
  ASSERT_TRUE(woken.wait_for(5s));
  asio::post(io, [&] {
    ran_on = std::this_thread::get_id();
    done.set();
  });
  ASSERT_TRUE(taken.wait_for(5s));
  waiter.join();
  EXPECT_NE(ran_on.load(), std::thread::id{});
  ex.stop();
}

TEST(Executor, AWaiterIsWokenWhenTheLoopFreesUpWithoutADriver) {
  asio::io_context io;
  Executor ex(io);
  ex.start();
  Signal in_handler, finish_handler;
  // The primary is busy in a handler, so a park request waits for it to finish.
  asio::post(io, [&] {
    in_handler.set();
    finish_handler.wait_for(10s);
  });
  ASSERT_TRUE(in_handler.wait_for(5s));
  // A caller asks for the loop and leaves before the primary parks (its wait ended).
  std::atomic<bool> answered{false};
  Signal requested;
  std::thread leaver([&] {
    // done() is first asked while the park request is pending.
    ex.drive([&] {
      requested.set();
      return answered.load();
    }, std::chrono::steady_clock::now() + 10s);
  });
  ASSERT_TRUE(requested.wait_for(5s));
  Signal woken;
  uint64_t token = ex.on_release([&] { woken.set(); });
  answered = true;
  leaver.join();
  finish_handler.set();  // the primary parks now, with no driver: the waiter is told
  ASSERT_NE(token, 0u);  // asked for, not yet parked: it waits
  EXPECT_TRUE(woken.wait_for(5s));
  ex.stop();
}

TEST(Executor, ADriverRunsWhatTheHandlerThatEndedItsWaitQueuedFirst) {  // AC-21
  asio::io_context io;
  Executor ex(io);
  ex.start();
  int driven = 0;
  for (int round = 0; round < 20; ++round) {
    std::atomic<bool> queued_ran{false};
    std::atomic<std::thread::id> ran_on{};
    Signal reply;
    // A read batch: an earlier message queues its work, then the reply completes the wait.
    asio::steady_timer timer(io, 10ms);  // lands after the primary stepped aside
    timer.async_wait([&](const std::error_code&) {
      ran_on = std::this_thread::get_id();
      asio::post(io, [&] { queued_ran = true; });
      reply.set();
    });
    ASSERT_TRUE(ex.drive([&] { return reply.is_set(); }, std::chrono::steady_clock::now() + 5s));
    if (ran_on.load() == std::this_thread::get_id()) {
      ++driven;
      EXPECT_TRUE(queued_ran.load()) << "round " << round;
    }
    // Whoever ran it, nothing of this round is left for the next one.
    ASSERT_TRUE(channel::testing::eventually([&] { return queued_ran.load(); }, 5s));
  }
  EXPECT_GE(driven, 10) << "the driver ran the batches";
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


// AC-3: a runner that stops its executor from inside a handler is not detached: the executor
// keeps it and joins it when destroyed, after the handler returned.
TEST(Executor, StopFromInsideAHandlerIsJoinedByTheDestructor) {
  asio::io_context io;
  auto ex = std::make_unique<Executor>(io);
  ex->start();
  Signal stopped;
  std::atomic<bool> handler_returned{false};
  struct Mark {
    std::atomic<bool>* flag;
    ~Mark() { flag->store(true); }
  };
  asio::post(io, [&] {
    Mark mark{&handler_returned};
    ex->stop();
    stopped.set();
    std::this_thread::sleep_for(20ms);  // work after stop(), inside the handler
  });
  ASSERT_TRUE(stopped.wait_for(5s));
  ex.reset();  // joins the runner, so the handler has returned by now
  EXPECT_TRUE(handler_returned);
}

}  // namespace
}  // namespace podium::actor
