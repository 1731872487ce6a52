#include "podium/host/exit_status.h"

#include <gtest/gtest.h>

namespace podium::host {
namespace {

TEST(ExitStatusTest, ToString) {
  EXPECT_EQ((ExitStatus{.pid = 1, .code = 3}).to_string(), "exited with status 3");
  EXPECT_EQ((ExitStatus{.pid = 1, .signaled = true, .code = SIGKILL}).to_string(),
            "killed by signal SIGKILL (9)");
  EXPECT_EQ((ExitStatus{.pid = 1, .signaled = true, .code = SIGSEGV, .core_dumped = true})
                .to_string(),
            "killed by signal SIGSEGV (11) (core dumped)");
  EXPECT_EQ((ExitStatus{.pid = 1, .signaled = true, .code = 99}).to_string(),
            "killed by signal 99");
}

TEST(ExitStatusTest, FromSiginfo) {
  siginfo_t info = {};
  info.si_pid = 42;
  info.si_code = CLD_EXITED;
  info.si_status = 7;
  EXPECT_EQ(ExitStatus::from_siginfo(info), (ExitStatus{.pid = 42, .code = 7}));
  info.si_code = CLD_KILLED;
  info.si_status = SIGTERM;
  EXPECT_EQ(ExitStatus::from_siginfo(info),
            (ExitStatus{.pid = 42, .signaled = true, .code = SIGTERM}));
  info.si_code = CLD_DUMPED;
  info.si_status = SIGABRT;
  EXPECT_EQ(ExitStatus::from_siginfo(info),
            (ExitStatus{.pid = 42, .signaled = true, .code = SIGABRT, .core_dumped = true}));
}

}  // namespace
}  // namespace podium::host
