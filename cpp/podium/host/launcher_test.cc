// launcher.h: workers started in sessions of their own, the ready handshake, identity by
// (pid, start time), and ending a session with everything in it. The workers are this test
// binary run as `--fake-worker MODE` (see fake_worker below).
#include "podium/host/launcher.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "podium/host/exit_status.h"

namespace podium::host {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
constexpr auto kTimeout = 10s;

// Stands in for `podium worker` where only the process protocol matters.
//   ready:      prints a line, announces tcp://127.0.0.1:4242, waits to be killed
//   stubborn:   as ready, ignoring SIGTERM
//   grandchild: starts a child in a process group of its own (as the worker starts its
//               procs), which ignores SIGTERM, prints "child PID", then as ready
//   early:      prints "boom" and exits with status 3
//   never:      prints "starting" and never announces
//   close:      closes its ready fd without writing to it, then waits
int fake_worker(const char* mode) {
  const std::string m(mode);
  printf("fake worker %s pid %d\n", mode, static_cast<int>(getpid()));
  fflush(stdout);
  if (m == "early") {
    printf("boom\n");
    return 3;
  }
  if (m == "never") {
    printf("starting\n");
    fflush(stdout);
    for (;;) pause();
  }
  if (m == "close") {
    close(atoi(getenv(kReadyFdEnv)));
    for (;;) pause();
  }
  if (m == "stubborn") signal(SIGTERM, SIG_IGN);
  if (m == "grandchild") {
    const pid_t child = fork();
    if (child == 0) {
      setpgid(0, 0);
      signal(SIGTERM, SIG_IGN);
      for (;;) pause();
    }
    setpgid(child, child);  // both sides, so that it is done when either returns
    printf("child %d\n", static_cast<int>(child));
    fflush(stdout);
  }
  if (!announce_ready("tcp://127.0.0.1:4242")) return 99;
  if (getenv(kReadyFdEnv) != nullptr) return 98;  // announce_ready unsets it
  for (;;) pause();
}

class LauncherTest : public ::testing::Test {
 protected:
  WorkerSpec spec(const std::string& mode, const std::string& name = "w") {
    WorkerSpec s;
    s.path = "/proc/self/exe";
    s.argv = {self_, "--fake-worker", mode};
    s.log = dir_ + "/" + name + ".log";
    return s;
  }
  void SetUp() override {
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    ASSERT_GT(n, 0);
    self_.assign(buf, static_cast<size_t>(n));
    char tmpl[] = "/tmp/podium-launcher-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const WorkerId& w : cleanup_) (void)stop_worker(w.pid, w.start_time, 0ms);
    std::string cmd = "rm -rf '" + dir_ + "'";
    (void)system(cmd.c_str());
  }
  static std::string read(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  // The pid after `key` in the log, or -1.
  static pid_t pid_in(const std::string& log, const std::string& key) {
    const std::string text = read(log);
    const size_t at = text.find(key);
    return at == std::string::npos ? -1 : std::stoi(text.substr(at + key.size()));
  }
  static pid_t child_of(const std::string& log) { return pid_in(log, "\nchild "); }
  static bool alive(pid_t pid) { return process_start_time(pid).has_value(); }

  std::string self_;
  std::string dir_;
  std::vector<WorkerId> cleanup_;
};

// WP-1, WP-2: the address comes through the ready fd; stop ends the worker.
TEST_F(LauncherTest, ReadyWorkerIsLaunchedAndStopped) {
  auto r = launch_workers("job-a", {spec("ready")}, kTimeout);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(r->size(), 1u);
  const LaunchedWorker w = (*r)[0];
  cleanup_.push_back(w.id);
  EXPECT_EQ(w.address, "tcp://127.0.0.1:4242");
  EXPECT_TRUE(worker_alive(w.id));
  EXPECT_EQ(process_start_time(w.id.pid), w.id.start_time);
  EXPECT_EQ(pid_in(spec("ready").log, "fake worker ready pid "), w.id.pid);
  EXPECT_EQ(getsid(w.id.pid), w.id.pid);  // a session of its own
  const auto t0 = Clock::now();
  ASSERT_TRUE(stop_worker(w.id.pid, w.id.start_time, 5s));
  EXPECT_LT(Clock::now() - t0, 2s);  // it went on SIGTERM, long before the grace
  EXPECT_FALSE(alive(w.id.pid));
  EXPECT_FALSE(worker_alive(w.id));
}

// WP-1: an exit before the address fails the launch with the exit status and the log.
TEST_F(LauncherTest, WorkerThatExitsEarlyIsReportedWithItsLog) {
  auto r = launch_workers("job-y", {spec("early")}, kTimeout);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, static_cast<uint16_t>(HostErrc::kNotReady));
  const std::string& msg = r.error().message;
  EXPECT_NE(msg.find("job job-y: worker `"), std::string::npos) << msg;
  EXPECT_NE(msg.find("exited with status 3 before it was ready"), std::string::npos) << msg;
  EXPECT_NE(msg.find("w.log:\nfake worker early pid "), std::string::npos) << msg;
  EXPECT_NE(msg.find("\nboom"), std::string::npos) << msg;
}

// WP-1: a worker that never announces is ended at the deadline; none of it is left.
TEST_F(LauncherTest, WorkerThatNeverAnnouncesTimesOutAndIsEnded) {
  const auto t0 = Clock::now();
  auto r = launch_workers("job-z", {spec("never")}, 300ms);
  ASSERT_FALSE(r);
  EXPECT_GE(Clock::now() - t0, 300ms);
  EXPECT_LT(Clock::now() - t0, 5s);
  const std::string& msg = r.error().message;
  EXPECT_NE(msg.find("did not write its address to PODIUM_READY_FD within 300 ms (1 of 1"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("\nstarting"), std::string::npos) << msg;
  const size_t at = msg.find("(pid ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_FALSE(alive(std::stoi(msg.substr(at + 5))));
}

TEST_F(LauncherTest, WorkerThatClosesItsReadyFdTimesOut) {
  auto r = launch_workers("job-c", {spec("close")}, 300ms);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("closed PODIUM_READY_FD without writing an address"),
            std::string::npos)
      << r.error().message;
}

// WP-1: one failing worker ends the launch of all, and all of them.
TEST_F(LauncherTest, OneFailingWorkerEndsTheOthers) {
  const auto a = spec("grandchild", "a");
  const auto b = spec("ready", "b");
  auto r = launch_workers("job-m", {a, b, spec("early", "c")}, kTimeout);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("c.log"), std::string::npos) << r.error().message;
  // What had started by the failure is gone (a worker that had not printed yet is too, but
  // the test cannot name it).
  for (const pid_t p : {child_of(a.log), pid_in(a.log, " pid "), pid_in(b.log, " pid ")}) {
    if (p > 0) {
      EXPECT_FALSE(alive(p)) << p;
    }
  }
}

TEST_F(LauncherTest, MissingExecutableFailsAtOnce) {
  WorkerSpec s = spec("ready");
  s.path = dir_ + "/no-such-binary";
  auto r = launch_workers("job-x", {s}, kTimeout);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, static_cast<uint16_t>(HostErrc::kExecFailed));
}

// WP-2: SIGTERM ignored, SIGKILL after the grace.
TEST_F(LauncherTest, WorkerThatIgnoresSigtermIsKilledAfterTheGrace) {
  auto r = launch_workers("job-s", {spec("stubborn")}, kTimeout);
  ASSERT_TRUE(r) << r.error().message;
  const WorkerId id = (*r)[0].id;
  cleanup_.push_back(id);
  const auto t0 = Clock::now();
  ASSERT_TRUE(stop_worker(id.pid, id.start_time, 300ms));
  EXPECT_GE(Clock::now() - t0, 300ms);
  EXPECT_LT(Clock::now() - t0, 5s);
  EXPECT_FALSE(alive(id.pid));
}

// WP-2: a process the worker started in a group of its own (still in its session) is
// ended too; once the worker has gone it gets only kOrphanGrace, not the whole grace.
TEST_F(LauncherTest, ProcessLeftInTheSessionIsKilled) {
  const WorkerSpec s = spec("grandchild");
  auto r = launch_workers("job-g", {s}, kTimeout);
  ASSERT_TRUE(r) << r.error().message;
  const WorkerId id = (*r)[0].id;
  cleanup_.push_back(id);
  const pid_t grandchild = child_of(s.log);
  ASSERT_GT(grandchild, 0);
  EXPECT_TRUE(alive(grandchild));
  EXPECT_EQ(getsid(grandchild), id.pid);
  EXPECT_NE(getpgid(grandchild), id.pid);
  const auto t0 = Clock::now();
  ASSERT_TRUE(stop_worker(id.pid, id.start_time, 30s));
  EXPECT_LT(Clock::now() - t0, 10s);
  EXPECT_FALSE(alive(id.pid));
  EXPECT_FALSE(alive(grandchild));
}

// WP-3: a stop aimed at an older process that had the worker's pid signals nothing.
TEST_F(LauncherTest, ReusedPidIsNotTakenForTheWorker) {
  auto r = launch_workers("job-r", {spec("ready")}, kTimeout);
  ASSERT_TRUE(r) << r.error().message;
  const WorkerId id = (*r)[0].id;
  cleanup_.push_back(id);
  const WorkerId older{id.pid, id.start_time + 1};
  EXPECT_FALSE(worker_alive(older));
  ASSERT_TRUE(stop_worker(id.pid, older.start_time, 100ms));
  EXPECT_TRUE(worker_alive(id));
  ASSERT_TRUE(stop_worker(id.pid, id.start_time, 1s));
  EXPECT_FALSE(worker_alive(id));
}

TEST_F(LauncherTest, StoppingWhatIsGoneIsNotAnError) {
  auto r = launch_workers("job-d", {spec("ready")}, kTimeout);
  ASSERT_TRUE(r) << r.error().message;
  const WorkerId id = (*r)[0].id;
  ASSERT_TRUE(stop_worker(id.pid, id.start_time, 1s));
  EXPECT_TRUE(stop_worker(id.pid, id.start_time, 1s));
}

TEST(AnnounceReady, WithoutTheVariableDoesNothing) {
  unsetenv(kReadyFdEnv);
  EXPECT_TRUE(announce_ready("tcp://x:1"));
  setenv(kReadyFdEnv, "not-a-number", 1);
  EXPECT_FALSE(announce_ready("tcp://x:1"));
  unsetenv(kReadyFdEnv);
}

}  // namespace
}  // namespace podium::host

int main(int argc, char** argv) {
  if (argc > 2 && std::strcmp(argv[1], "--fake-worker") == 0) {
    return podium::host::fake_worker(argv[2]);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
