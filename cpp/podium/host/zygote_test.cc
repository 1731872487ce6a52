// The zygote tests re-enter this binary as the zygote (`zygote_test --zygote`): its forked
// children act on their ZT_ACT variable (exit:N, sleep, env:NAME=VALUE, cwd:PATH, group).
#include "podium/host/zygote.h"

#include "podium/host/output_pump.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <chrono>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace podium::host {
namespace {

using namespace std::chrono_literals;
constexpr auto kWait = 10s;

// What a forked child does (it runs in the zygote's image, after zygote_serve returned).
[[noreturn]] void act(const ZygoteChild& child) {
  std::string a;
  for (const auto& [k, v] : child.env) {
    if (k == "ZT_ACT") a = v;
  }
  auto env_has = [&](std::string_view kv) {
    for (const auto& [k, v] : child.env) {
      if (k + "=" + v == kv) return true;
    }
    return false;
  };
  if (a.starts_with("exit:")) ::_exit(std::atoi(a.c_str() + 5));
  if (a == "sleep") {
    while (true) ::pause();
  }
  if (a.starts_with("env:")) ::_exit(env_has(a.substr(4)) ? 0 : 1);
  if (a.starts_with("cwd:")) {
    std::error_code ec;
    ::_exit(std::filesystem::current_path(ec) == a.substr(4) ? 0 : 1);
  }
  if (a == "group") ::_exit(::getpgid(0) == ::getpid() ? 0 : 1);
  if (a.starts_with("write:")) {  // to fds 1 and 3, then a death that flushes nothing
    std::string line = a.substr(6) + "\n";
    (void)!::write(1, line.data(), line.size());
    (void)!::write(3, line.data(), line.size());
    ::kill(::getpid(), SIGKILL);
  }
  ::_exit(99);
}

int zygote_main() {
  auto child = zygote_serve(3, ForkHooks{});
  if (child) act(*child);
  return child.error().is(HostErrc::kStopped) ? 0 : 1;
}

class ExitLog {
 public:
  OnExit callback() {
    return [this](const ExitStatus& s) {
      std::lock_guard lock(mu_);
      exits_[s.pid].push_back(s);
      cv_.notify_all();
    };
  }
  std::optional<ExitStatus> wait(pid_t pid) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, kWait, [&] { return exits_.contains(pid); })) return std::nullopt;
    return exits_[pid].front();
  }
  size_t count(pid_t pid) {
    std::lock_guard lock(mu_);
    return exits_.contains(pid) ? exits_[pid].size() : 0;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<pid_t, std::vector<ExitStatus>> exits_;
};

class ZygoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    io_thread_ = std::thread([this] { io_.run(); });
    watcher_ = std::make_unique<ChildWatcher>(io_);
    ChildSpec spec;
    spec.path = "/proc/self/exe";
    spec.argv = {"zygote_test", "--zygote"};
    auto z = Zygote::start(io_, *watcher_, spec);
    ASSERT_TRUE(z) << z.error().to_string();
    zygote_ = std::move(*z);
  }
  void TearDown() override {
    if (zygote_) zygote_->stop();
    zygote_.reset();
    watcher_->stop();
    work_.reset();
    io_.stop();
    io_thread_.join();
  }

  ZygoteChild child(std::string act) {
    return ZygoteChild{{"child"}, current_environment({{"ZT_ACT", std::move(act)}}), ""};
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  std::thread io_thread_;
  std::unique_ptr<ChildWatcher> watcher_;
  std::shared_ptr<Zygote> zygote_;
  ExitLog log_;
};

// ZY-6: the collapse changes page tables only; the memory reads back the same. Where the
// kernel collapses at all, a written 16 MiB anonymous region is among what it collapsed.
TEST(ZygoteHugePages, CollapsingKeepsTheContentsOfAnonymousMemory) {  // ZY-6
  constexpr size_t kSize = size_t{18} << 20;
  void* p = ::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto* words = static_cast<uint64_t*>(p);
  const size_t n = kSize / sizeof(uint64_t);
  for (size_t i = 0; i < n; ++i) words[i] = i * 0x9E3779B97F4A7C15ull;
  HugePageCollapse c = collapse_anonymous_memory();
  EXPECT_GE(c.chunks, 8u);  // 18 MiB holds at least eight aligned 2 MiB chunks
  EXPECT_LE(c.collapsed, c.chunks);
  EXPECT_EQ(c.bytes, c.collapsed * (size_t{2} << 20));
  if (c.collapsed == 0) {
    EXPECT_NE(c.first_error, 0) << "nothing collapsed, and no error said why";
  }
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += words[i] != i * 0x9E3779B97F4A7C15ull;
  EXPECT_EQ(bad, 0u);
  ::munmap(p, kSize);
}

TEST_F(ZygoteTest, AChildsExitCodeIsReportedOnce) {  // ZY-2
  auto pid = zygote_->spawn(child("exit:3"), log_.callback());
  ASSERT_TRUE(pid) << pid.error().to_string();
  auto s = log_.wait(*pid);
  ASSERT_TRUE(s);
  EXPECT_FALSE(s->signaled);
  EXPECT_EQ(s->code, 3);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(log_.count(*pid), 1u);
}

TEST_F(ZygoteTest, AKilledChildIsReportedWithItsSignal) {  // ZY-2, ZY-3
  auto pid = zygote_->spawn(child("sleep"), log_.callback());
  ASSERT_TRUE(pid);
  ASSERT_TRUE(zygote_->kill_group(*pid, SIGKILL));
  auto s = log_.wait(*pid);
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->signaled);
  EXPECT_EQ(s->code, SIGKILL);
  EXPECT_FALSE(zygote_->kill_group(*pid, SIGKILL));  // reported: no longer signalled
}

TEST_F(ZygoteTest, AChildGetsTheRequestedEnvironmentCwdAndItsOwnGroup) {  // ZY-3, ZY-4
  ::setenv("ZT_LATE", "set-after-the-zygote-started", 1);
  auto env = zygote_->spawn(child("env:ZT_LATE=set-after-the-zygote-started"), log_.callback());
  ::unsetenv("ZT_LATE");
  ASSERT_TRUE(env);
  auto tmp = std::filesystem::temp_directory_path().string();
  auto c = child("cwd:" + tmp);
  c.cwd = tmp;
  auto cwd = zygote_->spawn(c, log_.callback());
  auto group = zygote_->spawn(child("group"), log_.callback());
  ASSERT_TRUE(cwd && group);
  for (pid_t p : {*env, *cwd, *group}) {
    auto s = log_.wait(p);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->to_string(), "exited with status 0") << "pid " << p;
  }
}

TEST_F(ZygoteTest, AChildGetsTheSentDescriptorsAndTheZygoteKeepsNone) {  // ZY-5
  auto ends = make_proc_pipes();
  ASSERT_TRUE(ends) << ends.error().to_string();
  auto c = child("write:the last line");
  c.fds = {{ends->out_w.get(), 1}, {ends->err_w.get(), 2}, {ends->log_w.get(), 3}};
  auto pid = zygote_->spawn(c, log_.callback());
  ASSERT_TRUE(pid) << pid.error().to_string();
  ends->out_w.reset();
  ends->err_w.reset();
  ends->log_w.reset();
  auto s = log_.wait(*pid);
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->signaled);
  // End-of-file on every pipe: neither this process nor the zygote holds a write end.
  auto read_all = [](int fd) {
    std::string out;
    char buf[256];
    auto deadline = std::chrono::steady_clock::now() + kWait;
    while (std::chrono::steady_clock::now() < deadline) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        out.append(buf, static_cast<size_t>(n));
      } else if (n == 0) {
        return out;
      } else if (errno == EAGAIN) {
        std::this_thread::sleep_for(1ms);
      } else {
        break;
      }
    }
    return out + "<no end-of-file>";
  };
  EXPECT_EQ(read_all(ends->read.out.get()), "the last line\n");
  EXPECT_EQ(read_all(ends->read.log.get()), "the last line\n");
  EXPECT_EQ(read_all(ends->read.err.get()), "");
}

TEST_F(ZygoteTest, WhenTheZygoteDiesItsChildrenDieAndAreReported) {  // ZY-1, ZY-2, ZY-3
  auto a = zygote_->spawn(child("sleep"), log_.callback());
  auto b = zygote_->spawn(child("sleep"), log_.callback());
  ASSERT_TRUE(a && b);
  watcher_->kill_all(SIGKILL);  // the zygote is the watcher's only child
  for (pid_t p : {*a, *b}) {
    auto s = log_.wait(p);
    ASSERT_TRUE(s);
    EXPECT_TRUE(s->signaled);
  }
  // Gone for real (PDEATHSIG or the zygote's kill): no longer running within the bound. A
  // zombie waiting for PID 1 to reap it is gone as far as running goes.
  auto running = [](pid_t p) {
    std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return false;
    auto close = line.rfind(')');
    return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
  };
  auto deadline = std::chrono::steady_clock::now() + kWait;
  while ((running(*a) || running(*b)) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_FALSE(running(*a));
  EXPECT_FALSE(running(*b));
  auto later = zygote_->spawn(child("exit:0"), log_.callback(), 2s);
  EXPECT_FALSE(later);
  EXPECT_FALSE(zygote_->alive());
}

TEST_F(ZygoteTest, StopKillsTheChildrenAndTheZygoteExits) {  // ZY-3
  auto a = zygote_->spawn(child("sleep"), log_.callback());
  ASSERT_TRUE(a);
  zygote_->stop();
  auto s = log_.wait(*a);
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->signaled);
  auto deadline = std::chrono::steady_clock::now() + kWait;
  while (watcher_->alive() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(watcher_->alive(), 0u);  // the zygote saw EOF and exited
}

}  // namespace
}  // namespace podium::host

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--zygote") == 0) return podium::host::zygote_main();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
