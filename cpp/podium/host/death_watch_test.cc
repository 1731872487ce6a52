// DeathWatch: forked children attach to a slot and end in each way a proc can; the watcher
// reports each with the status waitpid then reports.
#include "podium/host/death_watch.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace podium::host {
namespace {

using namespace std::chrono_literals;

struct Told {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<ExitStatus> got;
  DeathWatch::OnDying callback() {
    return [this](const ExitStatus& s) {
      std::lock_guard lock(mu);
      got.push_back(s);
      cv.notify_all();
    };
  }
  std::optional<ExitStatus> wait() {
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, 20s, [&] { return !got.empty(); })) return std::nullopt;
    return got.front();
  }
};

// A child that attaches to `slot` (unless `attach` is false), says so on a pipe, then
// `how`: "exit:N", "kill" (SIGKILL to itself), "segv" (raise SIGSEGV), "wait" (pause).
pid_t start_child(DeathWatch& dw, size_t slot, const std::string& how, bool attach = true) {
  int p[2];
  if (::pipe(p) != 0) return -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    if (attach) {
      int fd = ::dup(dw.fd());
      ::setenv(DeathWatch::kEnv, (std::to_string(fd) + ":" + std::to_string(slot)).c_str(), 1);
      if (!attach_death_watch()) ::_exit(90);
      if (std::getenv(DeathWatch::kEnv) != nullptr) ::_exit(91);  // unset once attached
    }
    (void)!::write(p[1], "x", 1);
    if (how.starts_with("exit:")) ::_exit(std::atoi(how.c_str() + 5));
    if (how == "kill") ::kill(::getpid(), SIGKILL);
    if (how == "segv") {
      ::signal(SIGSEGV, SIG_DFL);
      ::raise(SIGSEGV);
    }
    while (true) ::pause();
  }
  ::close(p[1]);
  char c;
  (void)!::read(p[0], &c, 1);
  ::close(p[0]);
  return pid;
}

ExitStatus reap(pid_t pid) {
  siginfo_t info{};
  ::waitid(P_PID, pid, &info, WEXITED);
  return ExitStatus::from_siginfo(info);
}

class DeathWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dw = DeathWatch::create();
    if (!dw) GTEST_SKIP() << dw.error().to_string();
    dw_ = std::move(*dw);
  }
  std::unique_ptr<DeathWatch> dw_;
};

TEST_F(DeathWatchTest, EveryWayOfDyingIsToldWithTheStatusTheReapGives) {  // DW-1
  for (std::string how : {"exit:3", "kill", "segv", "wait"}) {
    SCOPED_TRACE(how);
    auto slot = dw_->reserve();
    ASSERT_TRUE(slot);
    Told told;
    pid_t pid = -1;
    // Watched from before the spawn returns, as ProcSpawner does (the child may die at once).
    pid = start_child(*dw_, *slot, how);
    ASSERT_GT(pid, 0);
    dw_->watch(*slot, pid, told.callback());
    if (how == "wait") ::kill(pid, SIGKILL);
    auto early = told.wait();
    ExitStatus reaped = reap(pid);
    ASSERT_TRUE(early) << "no early notice";
    EXPECT_EQ(*early, reaped) << early->to_string() << " vs " << reaped.to_string();
    dw_->release(*slot);
    std::lock_guard lock(told.mu);
    EXPECT_EQ(told.got.size(), 1u);  // once
  }
}

// A status of 0 may be told early or left to the reap (an exiting leader's 0 could still be
// "not set yet"); told, it is right.
TEST_F(DeathWatchTest, ACleanExitIsToldRightIfAtAll) {  // DW-1
  auto slot = dw_->reserve();
  ASSERT_TRUE(slot);
  Told told;
  pid_t pid = start_child(*dw_, *slot, "exit:0");
  dw_->watch(*slot, pid, told.callback());
  ExitStatus reaped = reap(pid);
  dw_->release(*slot);
  dw_->stop();
  std::lock_guard lock(told.mu);
  ASSERT_LE(told.got.size(), 1u);
  if (!told.got.empty()) EXPECT_EQ(told.got[0], reaped);
}

TEST_F(DeathWatchTest, AChildThatNeverAttachedIsOnlyReaped) {  // DW-1
  auto slot = dw_->reserve();
  ASSERT_TRUE(slot);
  Told told;
  pid_t pid = start_child(*dw_, *slot, "exit:4", /*attach=*/false);
  dw_->watch(*slot, pid, told.callback());
  EXPECT_EQ(reap(pid).code, 4);
  dw_->release(*slot);
  dw_->stop();  // no OnDying after stop() returned
  std::lock_guard lock(told.mu);
  EXPECT_TRUE(told.got.empty());
}

TEST_F(DeathWatchTest, AReleasedSlotIsReusedClean) {  // DW-2
  auto a = dw_->reserve();
  ASSERT_TRUE(a);
  Told first;
  pid_t pid = start_child(*dw_, *a, "exit:5");
  dw_->watch(*a, pid, first.callback());
  ASSERT_TRUE(first.wait());
  reap(pid);
  dw_->release(*a);
  auto b = dw_->reserve();
  ASSERT_TRUE(b);
  EXPECT_EQ(*a, *b);  // the lowest free slot: the same one, its old mark cleared
  Told second;
  pid = start_child(*dw_, *b, "exit:6");
  dw_->watch(*b, pid, second.callback());
  auto s = second.wait();
  reap(pid);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->code, 6);
  EXPECT_EQ(s->pid, pid);
}

// The nice value (field 19) of every thread of `pid`.
std::vector<int> thread_nices(pid_t pid) {
  std::vector<int> out;
  std::string dir = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream f(e.path() / "stat");
    std::string line;
    std::getline(f, line);
    std::istringstream rest(line.substr(line.rfind(')') + 2));  // from field 3, the state
    std::string field;
    for (int i = 3; i <= 19 && rest >> field; ++i) {
    }
    out.push_back(std::stoi(field));
  }
  return out;
}

TEST_F(DeathWatchTest, LoweringADyingChildLowersEveryThreadItHas) {  // DW-3
  auto slot = dw_->reserve();
  ASSERT_TRUE(slot);
  pid_t pid = start_child(*dw_, *slot, "wait");  // two threads: its own and the watch's
  ASSERT_GT(pid, 0);
  std::vector<int> before = thread_nices(pid);
  ASSERT_GE(before.size(), 2u);
  int ours = ::getpriority(PRIO_PROCESS, 0);  // what a forked child starts with
  ASSERT_LT(ours, DeathWatch::kDyingNice);
  for (int n : before) EXPECT_EQ(n, ours);
  DeathWatch::lower_dying(pid);
  std::vector<int> after = thread_nices(pid);
  EXPECT_EQ(after.size(), before.size());
  for (int n : after) EXPECT_EQ(n, DeathWatch::kDyingNice);
  ::kill(pid, SIGKILL);
  reap(pid);
  DeathWatch::lower_dying(pid);  // reaped: nothing to lower, and no harm
  dw_->release(*slot);
}

TEST(DeathWatchAttach, WithoutTheVariableNothingHappensAndABadSlotIsRefused) {  // DW-1
  ::unsetenv(DeathWatch::kEnv);
  EXPECT_TRUE(attach_death_watch());
  ::setenv(DeathWatch::kEnv, "0:1", 1);  // fd 0 is not a watch memfd
  EXPECT_FALSE(attach_death_watch());
  EXPECT_EQ(std::getenv(DeathWatch::kEnv), nullptr);
}

}  // namespace
}  // namespace podium::host
