#include "podium/host/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <optional>
#include <string>

#include "podium/base/fd_room_for_tests.h"
#include "podium/host/error.h"
#include "podium/host/exit_status.h"

namespace podium::host {
namespace {

UniqueFd open_pidfd(pid_t pid) {
  return UniqueFd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
}

// Whether the process behind `pidfd` exits within `timeout_ms`.
bool exits_within(const UniqueFd& pidfd, int timeout_ms) {
  pollfd p = {.fd = pidfd.get(), .events = POLLIN};
  return poll(&p, 1, timeout_ms) == 1;
}

// Reaps our child `pid` if it exits within `timeout_ms`; otherwise SIGKILLs and reaps it.
std::optional<ExitStatus> reap_within(pid_t pid, int timeout_ms) {
  UniqueFd pidfd = open_pidfd(pid);
  const bool exited = pidfd && exits_within(pidfd, timeout_ms);
  if (!exited) ::kill(pid, SIGKILL);
  siginfo_t info = {};
  waitid(P_PID, pid, &info, WEXITED);
  if (!exited) return std::nullopt;
  return ExitStatus::from_siginfo(info);
}

bool has_children() {
  siginfo_t info = {};
  return waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0;
}

// HO-6
TEST(SpawnTest, MissingBinaryFailsSynchronously) {
  auto proc = spawn_process(ChildSpec{.path = "/nonexistent/podium-no-such-binary"});
  ASSERT_FALSE(proc.has_value());
  EXPECT_TRUE(proc.error().is(HostErrc::kExecFailed)) << proc.error().to_string();
  EXPECT_NE(proc.error().message.find("/nonexistent/podium-no-such-binary"), std::string::npos);
  EXPECT_NE(proc.error().message.find(strerror(ENOENT)), std::string::npos)
      << proc.error().message;
  EXPECT_FALSE(has_children()) << "the failed child was not reaped";
}

// HO-6
// HO-7: out of descriptors, the error names the limit reached and how to raise it.
TEST(SpawnTest, RunningOutOfDescriptorsNamesTheLimit) {
  ScopedFdRoom room(2);  // room for the stdout pipe, not for the stderr one
  ASSERT_TRUE(room.ok());
  ChildSpec spec;
  spec.path = "/bin/true";
  spec.capture_output = true;
  auto r = spawn_process(spec);
  ASSERT_TRUE(room.restore());
  ASSERT_FALSE(r.has_value());
  const std::string what = r.error().message;
  EXPECT_NE(what.find("Too many open files"), std::string::npos) << what;
  EXPECT_NE(what.find("RLIMIT_NOFILE of " + std::to_string(room.limit()) + " descriptors"),
            std::string::npos) << what;
  EXPECT_NE(what.find("raise the hard limit"), std::string::npos) << what;
  EXPECT_FALSE(has_children());
}

TEST(SpawnTest, BadWorkingDirectoryFailsSynchronously) {
  ChildSpec spec{.path = "/bin/true", .cwd = "/nonexistent/dir"};
  auto proc = spawn_process(spec);
  ASSERT_FALSE(proc.has_value());
  EXPECT_TRUE(proc.error().is(HostErrc::kExecFailed));
  EXPECT_NE(proc.error().message.find("chdir"), std::string::npos) << proc.error().message;
  EXPECT_FALSE(has_children());
}

TEST(SpawnTest, RejectsInvalidSpecs) {
  const auto rejected = [](const ChildSpec& spec) {
    auto proc = spawn_process(spec);
    if (proc) reap_within(proc->pid, 0);
    return !proc && proc.error().is(HostErrc::kInvalidSpec);
  };
  EXPECT_TRUE(rejected(ChildSpec{}));
  EXPECT_TRUE(rejected(ChildSpec{.path = "/bin/true", .env = {{"A=B", "x"}}}));
  EXPECT_TRUE(rejected(ChildSpec{.path = "/bin/true", .fds = {{0, 3}, {1, 3}}}));
  EXPECT_TRUE(rejected(ChildSpec{.path = "/bin/true", .fds = {{0, -1}}}));
  EXPECT_TRUE(rejected(ChildSpec{.path = "/bin/true", .capture_output = true, .fds = {{0, 1}}}));
  EXPECT_TRUE(rejected(ChildSpec{.path = "/bin/true", .fds = {{1000, 3}}}));  // not open
}

// The child starts with default dispositions and an empty mask, whatever the parent has.
TEST(SpawnTest, ChildStartsWithDefaultSignalState) {
  struct sigaction ignore = {}, old_action = {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGTERM, &ignore, &old_action);
  sigset_t term, old_mask;
  sigemptyset(&term);
  sigaddset(&term, SIGINT);
  pthread_sigmask(SIG_BLOCK, &term, &old_mask);
  auto proc = spawn_process(ChildSpec{.path = "/bin/sleep", .argv = {"sleep", "30"}});
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  sigaction(SIGTERM, &old_action, nullptr);
  ASSERT_TRUE(proc.has_value()) << proc.error().to_string();

  ::kill(proc->pid, SIGTERM);
  auto status = reap_within(proc->pid, 5000);
  ASSERT_TRUE(status.has_value()) << "SIGTERM stayed ignored in the child";
  EXPECT_EQ(*status, (ExitStatus{.pid = proc->pid, .signaled = true, .code = SIGTERM}));
}

// HO-3: a helper process spawns a grandchild and is SIGKILLed; with die_with_parent the
// kernel kills the grandchild, without it the grandchild lives on.
void check_die_with_parent(bool die_with_parent) {
  int report[2];
  ASSERT_EQ(pipe2(report, O_CLOEXEC), 0);
  const pid_t helper = fork();
  ASSERT_GE(helper, 0);
  if (helper == 0) {
    ChildSpec spec{.path = "/bin/sleep", .argv = {"sleep", "30"}};
    spec.die_with_parent = die_with_parent;
    auto proc = spawn_process(spec);
    const pid_t pid = proc ? proc->pid : -1;
    if (write(report[1], &pid, sizeof pid) != sizeof pid) _exit(1);
    pause();
    _exit(0);
  }
  close(report[1]);
  UniqueFd report_r(report[0]);
  pid_t grandchild = -1;
  pollfd p = {.fd = report_r.get(), .events = POLLIN};
  const bool reported = poll(&p, 1, 5000) == 1 &&
                        read(report_r.get(), &grandchild, sizeof grandchild) == sizeof grandchild;
  UniqueFd grandchild_fd = grandchild > 0 ? open_pidfd(grandchild) : UniqueFd();
  ::kill(helper, SIGKILL);
  waitpid(helper, nullptr, 0);
  ASSERT_TRUE(reported && grandchild > 0) << "the helper did not spawn";
  ASSERT_TRUE(grandchild_fd) << strerror(errno);

  const bool died = exits_within(grandchild_fd, die_with_parent ? 2000 : 300);
  if (!died) syscall(SYS_pidfd_send_signal, grandchild_fd.get(), SIGKILL, nullptr, 0);
  EXPECT_EQ(died, die_with_parent);
}

TEST(SpawnTest, NewSessionLeadsASessionAndAGroup) {
  ChildSpec spec;
  spec.path = "/bin/sleep";
  spec.argv = {"sleep", "30"};
  spec.new_session = true;
  spec.new_process_group = false;  // implied by the session
  auto proc = spawn_process(spec);
  ASSERT_TRUE(proc) << proc.error().message;
  EXPECT_EQ(getsid(proc->pid), proc->pid);
  EXPECT_EQ(getpgid(proc->pid), proc->pid);
  EXPECT_NE(getsid(proc->pid), getsid(0));
  ::kill(proc->pid, SIGKILL);
  reap_within(proc->pid, 5000);
}

TEST(SpawnTest, DieWithParentKillsOrphan) { check_die_with_parent(true); }
TEST(SpawnTest, WithoutDieWithParentOrphanSurvives) { check_die_with_parent(false); }

}  // namespace
}  // namespace podium::host
