#include "podium/host/child_watcher.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace podium::host {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
constexpr auto kWait = 10s;  // bound of every wait; failures show long before a CI timeout

// Records OnExit calls: every call is kept, to check that each child's comes exactly once.
class ExitLog {
 public:
  OnExit callback() {
    return [this](const ExitStatus& s) {
      std::lock_guard lock(mu_);
      calls_[s.pid].push_back(s);
      at_[s.pid] = Clock::now();
      cv_.notify_all();
    };
  }
  std::optional<ExitStatus> wait(pid_t pid) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, kWait, [&] { return calls_.contains(pid); })) return std::nullopt;
    return calls_[pid].front();
  }
  bool wait_all(size_t n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, kWait, [&] { return calls_.size() >= n; });
  }
  size_t calls(pid_t pid) {
    std::lock_guard lock(mu_);
    return calls_.contains(pid) ? calls_[pid].size() : 0;
  }
  Clock::time_point at(pid_t pid) {
    std::lock_guard lock(mu_);
    return at_[pid];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<pid_t, std::vector<ExitStatus>> calls_;
  std::map<pid_t, Clock::time_point> at_;
};

class OutputLog {
 public:
  OnOutputLine callback() {
    return [this](pid_t pid, Stream stream, std::string_view line) {
      std::lock_guard lock(mu_);
      lines_[{pid, stream}].emplace_back(line);
      cv_.notify_all();
    };
  }
  std::vector<std::string> lines(pid_t pid, Stream stream) {
    std::lock_guard lock(mu_);
    return lines_[{pid, stream}];
  }
  size_t count(pid_t pid) {
    std::lock_guard lock(mu_);
    return lines_[{pid, Stream::kStdout}].size() + lines_[{pid, Stream::kStderr}].size();
  }
  bool wait_line(pid_t pid, const std::string& line) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, kWait, [&] {
      const auto& out = lines_[{pid, Stream::kStdout}];
      return std::find(out.begin(), out.end(), line) != out.end();
    });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<pid_t, Stream>, std::vector<std::string>> lines_;
};

UniqueFd open_pidfd(pid_t pid) {
  return UniqueFd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
}

// Whether the process behind `pidfd` exits within `timeout`; SIGKILLs it if not.
bool exits_within(const UniqueFd& pidfd, std::chrono::milliseconds timeout) {
  pollfd p = {.fd = pidfd.get(), .events = POLLIN};
  if (poll(&p, 1, static_cast<int>(timeout.count())) == 1) return true;
  syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0);
  return false;
}

ChildSpec shell(std::string script, bool capture = false) {
  ChildSpec spec{.path = "/bin/sh", .argv = {"sh", "-c", std::move(script)}};
  spec.capture_output = capture;
  return spec;
}

// Runs the io_context on its own threads. Each test declares its logs, then its watcher, so
// the watcher is destroyed first (killing and reaping whatever a failed test left behind) and
// no callback outlives the logs.
class ChildWatcherTest : public ::testing::TestWithParam<ExitWatch> {
 protected:
  void SetUp() override { run_io(1); }
  void TearDown() override {
    work_.reset();
    io_.stop();
    for (auto& t : threads_) t.join();
    siginfo_t info = {};
    EXPECT_NE(waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT), 0)
        << "a child of the test is left (zombie or alive): pid " << info.si_pid;  // HO-3
  }
  void run_io(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { io_.run(); });
  }
  std::unique_ptr<ChildWatcher> make_watcher() {
    return std::make_unique<ChildWatcher>(io_, GetParam());
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  std::vector<std::thread> threads_;
};

// HO-1, HO-2
TEST_P(ChildWatcherTest, ReportsExitCodeOnce) {
  ExitLog exits;
  auto watcher = make_watcher();
  auto t = watcher->spawn(ChildSpec{.path = "/bin/true"}, exits.callback());
  auto three = watcher->spawn(shell("exit 3"), exits.callback());
  ASSERT_TRUE(t && three);
  EXPECT_EQ(exits.wait(*t), (ExitStatus{.pid = *t, .code = 0}));
  auto status = exits.wait(*three);
  ASSERT_TRUE(status);
  EXPECT_EQ(*status, (ExitStatus{.pid = *three, .code = 3}));
  EXPECT_EQ(status->to_string(), "exited with status 3");
  EXPECT_EQ(watcher->alive(), 0u);
  watcher.reset();
  EXPECT_EQ(exits.calls(*t), 1u);
  EXPECT_EQ(exits.calls(*three), 1u);
}

TEST_P(ChildWatcherTest, ReportsSelfInflictedSignal) {
  ExitLog exits;
  auto watcher = make_watcher();
  auto pid = watcher->spawn(shell("ulimit -c 0; kill -SEGV $$"), exits.callback());
  ASSERT_TRUE(pid) << pid.error().to_string();
  auto status = exits.wait(*pid);
  ASSERT_TRUE(status);
  EXPECT_EQ(*status, (ExitStatus{.pid = *pid, .signaled = true, .code = SIGSEGV}));
  EXPECT_EQ(status->to_string(), "killed by signal SIGSEGV (11)");
}

// HO-2: the exit is seen at once; HO-4: a reaped child can no longer be signalled.
TEST_P(ChildWatcherTest, SigkillIsSeenPromptly) {
  ExitLog exits;
  auto watcher = make_watcher();
  auto pid = watcher->spawn(ChildSpec{.path = "/bin/sleep", .argv = {"sleep", "30"}},
                            exits.callback());
  ASSERT_TRUE(pid) << pid.error().to_string();
  std::this_thread::sleep_for(20ms);
  const auto t0 = Clock::now();
  ASSERT_TRUE(watcher->kill(*pid, SIGKILL));
  auto status = exits.wait(*pid);
  ASSERT_TRUE(status);
  const auto latency = std::chrono::duration_cast<std::chrono::microseconds>(exits.at(*pid) - t0);
  std::printf("[ figure ] kill(SIGKILL) -> OnExit latency (%s): %lld us\n",
              GetParam() == ExitWatch::kAuto ? "pidfd" : "SIGCHLD",
              static_cast<long long>(latency.count()));
  EXPECT_LT(latency, 1s);
  EXPECT_EQ(*status, (ExitStatus{.pid = *pid, .signaled = true, .code = SIGKILL}));
  EXPECT_EQ(status->to_string(), "killed by signal SIGKILL (9)");
  auto again = watcher->kill(*pid, SIGKILL);
  ASSERT_FALSE(again);
  EXPECT_TRUE(again.error().is(HostErrc::kNoSuchChild));
}

// HO-6
TEST_P(ChildWatcherTest, MissingBinaryFailsSynchronously) {
  ExitLog exits;
  auto watcher = make_watcher();
  auto pid = watcher->spawn(ChildSpec{.path = "/nonexistent/podium-no-such-binary"},
                            exits.callback());
  ASSERT_FALSE(pid);
  EXPECT_TRUE(pid.error().is(HostErrc::kExecFailed));
  EXPECT_NE(pid.error().message.find("No such file or directory"), std::string::npos)
      << pid.error().message;
  EXPECT_EQ(watcher->alive(), 0u);
}

// HO-5
TEST_P(ChildWatcherTest, CapturesLinesBeforeExit) {
  OutputLog output;
  std::atomic<size_t> lines_at_exit = 0;
  std::optional<ExitStatus> exit_status;
  std::mutex mu;
  std::condition_variable cv;
  auto watcher = make_watcher();
  auto pid = watcher->spawn(
      shell("printf 'one\\n\\ntwo\\n'; echo oops >&2; printf 'partial'", true),
      [&](const ExitStatus& s) {
        lines_at_exit = output.count(s.pid);
        std::lock_guard lock(mu);
        exit_status = s;
        cv.notify_all();
      },
      output.callback());
  ASSERT_TRUE(pid) << pid.error().to_string();
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, kWait, [&] { return exit_status.has_value(); }));
  }
  EXPECT_EQ(output.lines(*pid, Stream::kStdout),
            (std::vector<std::string>{"one", "", "two", "partial"}));
  EXPECT_EQ(output.lines(*pid, Stream::kStderr), (std::vector<std::string>{"oops"}));
  EXPECT_EQ(lines_at_exit, 5u);
  watcher.reset();
  EXPECT_EQ(output.count(*pid), 5u);
}

// HO-5: lines over 64 KiB come in 64 KiB pieces; a line of exactly 64 KiB stays whole.
TEST_P(ChildWatcherTest, SplitsLongLines) {
  OutputLog output;
  ExitLog exits;
  auto watcher = make_watcher();
  auto pid = watcher->spawn(shell("head -c 200000 /dev/zero | tr '\\0' a; echo;"
                                  "head -c 65536 /dev/zero | tr '\\0' b; echo; printf end",
                                  true),
                            exits.callback(), output.callback());
  ASSERT_TRUE(pid) << pid.error().to_string();
  ASSERT_TRUE(exits.wait(*pid));
  const std::string piece(65536, 'a');
  EXPECT_EQ(output.lines(*pid, Stream::kStdout),
            (std::vector<std::string>{piece, piece, piece, std::string(200000 - 3 * 65536, 'a'),
                                      std::string(65536, 'b'), "end"}));
}

TEST_P(ChildWatcherTest, SetsEnvironmentAndWorkingDirectory) {
  OutputLog output;
  ExitLog exits;
  auto watcher = make_watcher();
  ChildSpec spec = shell("echo \"$PODIUM_TEST_A $HOME\"; echo \"$PATH\"; pwd", true);
  spec.env = {{"PODIUM_TEST_A", "alpha"}, {"HOME", "/podium-home"}};
  spec.cwd = "/tmp";
  auto pid = watcher->spawn(spec, exits.callback(), output.callback());
  ASSERT_TRUE(pid) << pid.error().to_string();
  ASSERT_TRUE(exits.wait(*pid));
  const char* path = getenv("PATH");
  EXPECT_EQ(output.lines(*pid, Stream::kStdout),
            (std::vector<std::string>{"alpha /podium-home", path ? path : "", "/tmp"}));
}

// Passed fds land at their targets (also when source and target are the same number, where
// the source was close-on-exec); every other descriptor is closed.
TEST_P(ChildWatcherTest, PassesFdsAndClosesTheRest) {
  OutputLog output;
  ExitLog exits;
  auto watcher = make_watcher();
  int a[2], b[2];
  ASSERT_EQ(pipe2(a, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(b, O_CLOEXEC), 0);
  UniqueFd a_r(a[0]), a_w(a[1]), b_r(b[0]), b_w(b[1]);
  UniqueFd leaked(dup(b_r.get()));  // not close-on-exec
  ChildSpec spec = shell("echo via-3 >&3; echo via-same >&" + std::to_string(b_w.get()) +
                             "; test -e /proc/self/fd/" + std::to_string(leaked.get()) +
                             " && echo leaked || echo closed",
                         true);
  spec.fds = {{a_w.get(), 3}, {b_w.get(), b_w.get()}};
  auto pid = watcher->spawn(spec, exits.callback(), output.callback());
  ASSERT_TRUE(pid) << pid.error().to_string();
  auto status = exits.wait(*pid);
  ASSERT_TRUE(status);
  EXPECT_EQ(status->code, 0);
  EXPECT_EQ(output.lines(*pid, Stream::kStdout), (std::vector<std::string>{"closed"}));
  EXPECT_EQ(output.lines(*pid, Stream::kStderr), (std::vector<std::string>{}));
  char buf[64] = {};
  EXPECT_EQ(read(a_r.get(), buf, sizeof buf), 6);
  EXPECT_EQ(std::string(buf, 6), "via-3\n");
  EXPECT_EQ(read(b_r.get(), buf, sizeof buf), 9);
  EXPECT_EQ(std::string(buf, 9), "via-same\n");
}

// Reads the pid that `sh -c 'sleep 30 & echo $!; wait'` prints for its background child.
pid_t grandchild_of(OutputLog& output, pid_t pid) {
  for (auto deadline = Clock::now() + kWait; Clock::now() < deadline;) {
    auto lines = output.lines(pid, Stream::kStdout);
    if (!lines.empty()) return std::stoi(lines.front());
    std::this_thread::sleep_for(5ms);
  }
  return -1;
}

TEST_P(ChildWatcherTest, KillGroupKillsDescendants) {
  OutputLog output;
  ExitLog exits;
  auto watcher = make_watcher();
  auto pid = watcher->spawn(shell("sleep 30 & echo $!; wait", true), exits.callback(),
                            output.callback());
  ASSERT_TRUE(pid) << pid.error().to_string();
  const pid_t grandchild = grandchild_of(output, *pid);
  ASSERT_GT(grandchild, 0);
  UniqueFd grandchild_fd = open_pidfd(grandchild);
  ASSERT_TRUE(grandchild_fd);
  ASSERT_TRUE(watcher->kill_group(*pid, SIGKILL));
  EXPECT_EQ(exits.wait(*pid), (ExitStatus{.pid = *pid, .signaled = true, .code = SIGKILL}));
  EXPECT_TRUE(exits_within(grandchild_fd, 2s));

  ChildSpec shared{.path = "/bin/sleep", .argv = {"sleep", "30"}};
  shared.new_process_group = false;  // the destructor can kill it, but not its group
  auto lone = watcher->spawn(shared, exits.callback());
  ASSERT_TRUE(lone);
  auto refused = watcher->kill_group(*lone, SIGKILL);
  ASSERT_FALSE(refused);
  EXPECT_TRUE(refused.error().is(HostErrc::kNoProcessGroup));
}

TEST_P(ChildWatcherTest, KillAllSignalsEveryChild) {
  ExitLog exits;
  auto watcher = make_watcher();
  std::vector<pid_t> pids;
  for (int i = 0; i < 3; ++i) {
    auto pid = watcher->spawn(shell("sleep 30"), exits.callback());
    ASSERT_TRUE(pid);
    pids.push_back(*pid);
  }
  watcher->kill_all(SIGKILL);
  for (pid_t pid : pids) {
    EXPECT_EQ(exits.wait(pid), (ExitStatus{.pid = pid, .signaled = true, .code = SIGKILL}));
  }
}

TEST_P(ChildWatcherTest, TerminateAllEscalatesAfterGrace) {
  OutputLog output;
  ExitLog exits;
  std::promise<Clock::time_point> done;
  auto watcher = make_watcher();
  auto stubborn =
      watcher->spawn(shell("trap '' TERM; echo ready; exec sleep 30", true), exits.callback(),
                     output.callback());
  auto polite = watcher->spawn(ChildSpec{.path = "/bin/sleep", .argv = {"sleep", "30"}},
                               exits.callback());
  ASSERT_TRUE(stubborn && polite);
  ASSERT_TRUE(output.wait_line(*stubborn, "ready"));
  const auto t0 = Clock::now();
  constexpr auto kGrace = 300ms;
  watcher->terminate_all(kGrace, [&] { done.set_value(Clock::now()); });
  auto finished = done.get_future();
  ASSERT_EQ(finished.wait_for(kWait), std::future_status::ready);
  EXPECT_GE(finished.get() - t0, kGrace);
  EXPECT_EQ(exits.wait(*polite),
            (ExitStatus{.pid = *polite, .signaled = true, .code = SIGTERM}));
  EXPECT_EQ(exits.wait(*stubborn),
            (ExitStatus{.pid = *stubborn, .signaled = true, .code = SIGKILL}));
  EXPECT_EQ(watcher->alive(), 0u);

  std::promise<void> none;  // nothing to terminate: done still runs
  watcher->terminate_all(kGrace, [&] { none.set_value(); });
  EXPECT_EQ(none.get_future().wait_for(kWait), std::future_status::ready);
}

// HO-1, HO-3, HO-5 under load, with the io_context on two threads.
TEST_P(ChildWatcherTest, FiftyChildrenOnTwoThreads) {
  run_io(1);  // a second thread
  constexpr int kChildren = 50;
  OutputLog output;
  ExitLog exits;
  auto watcher = make_watcher();
  std::vector<pid_t> pids;
  const auto t0 = Clock::now();
  for (int i = 0; i < kChildren; ++i) {
    auto pid = watcher->spawn(
        ChildSpec{.path = "/bin/sh",
                  .argv = {"sh", "-c", "echo child $1; echo err $1 >&2; exit $(($1 % 7))", "sh",
                           std::to_string(i)},
                  .capture_output = true},
        exits.callback(), output.callback());
    ASSERT_TRUE(pid) << pid.error().to_string();
    pids.push_back(*pid);
  }
  const auto spawn_us =
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
  std::printf("[ figure ] spawn() of /bin/sh with captured output: %lld us per child\n",
              static_cast<long long>(spawn_us / kChildren));
  ASSERT_TRUE(exits.wait_all(kChildren));
  for (int i = 0; i < kChildren; ++i) {
    EXPECT_EQ(exits.wait(pids[i]), (ExitStatus{.pid = pids[i], .code = i % 7}));
    EXPECT_EQ(output.lines(pids[i], Stream::kStdout),
              (std::vector<std::string>{"child " + std::to_string(i)}));
    EXPECT_EQ(output.lines(pids[i], Stream::kStderr),
              (std::vector<std::string>{"err " + std::to_string(i)}));
  }
  EXPECT_EQ(watcher->alive(), 0u);
  watcher.reset();
  for (pid_t pid : pids) EXPECT_EQ(exits.calls(pid), 1u);
}

// HO-3, HO-1: the destructor kills the whole group and reaps the child, without OnExit.
TEST_P(ChildWatcherTest, DestructorKillsAndReaps) {
  OutputLog output;
  ExitLog exits;
  auto watcher = make_watcher();
  auto pid = watcher->spawn(shell("sleep 30 & echo $!; wait", true), exits.callback(),
                            output.callback());
  ASSERT_TRUE(pid) << pid.error().to_string();
  const pid_t grandchild = grandchild_of(output, *pid);
  ASSERT_GT(grandchild, 0);
  UniqueFd grandchild_fd = open_pidfd(grandchild);
  ASSERT_TRUE(grandchild_fd);
  watcher.reset();
  siginfo_t info = {};
  EXPECT_EQ(waitid(P_PID, *pid, &info, WEXITED | WNOHANG), -1) << "child not reaped";
  EXPECT_EQ(errno, ECHILD);
  EXPECT_TRUE(exits_within(grandchild_fd, 2s));
  EXPECT_EQ(exits.calls(*pid), 0u);
}

// stop() from inside a callback neither deadlocks nor lets another callback run.
TEST_P(ChildWatcherTest, StopFromCallback) {
  ExitLog exits;
  std::promise<void> stopped;
  auto watcher = make_watcher();
  auto sleeper = watcher->spawn(shell("sleep 30"), exits.callback());
  ASSERT_TRUE(sleeper);
  auto quick = watcher->spawn(ChildSpec{.path = "/bin/true"}, [&](const ExitStatus&) {
    watcher->stop();
    stopped.set_value();
  });
  ASSERT_TRUE(quick);
  ASSERT_EQ(stopped.get_future().wait_for(kWait), std::future_status::ready);
  EXPECT_EQ(watcher->alive(), 0u);
  EXPECT_EQ(exits.calls(*sleeper), 0u);
  auto late = watcher->spawn(ChildSpec{.path = "/bin/true"}, exits.callback());
  ASSERT_FALSE(late);
  EXPECT_TRUE(late.error().is(HostErrc::kStopped));
}

INSTANTIATE_TEST_SUITE_P(Watch, ChildWatcherTest,
                         ::testing::Values(ExitWatch::kAuto, ExitWatch::kSigchld),
                         [](const auto& info) {
                           return info.param == ExitWatch::kAuto ? "Pidfd" : "Sigchld";
                         });

}  // namespace
}  // namespace podium::host
