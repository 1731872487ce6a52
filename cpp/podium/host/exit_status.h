// ExitStatus: how a child process ended, as reported by waitid(2).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <string>

namespace podium::host {

struct ExitStatus {
  pid_t pid = 0;
  bool signaled = false;     // killed by a signal; otherwise exited
  int code = 0;              // the exit status, or the signal number when `signaled`
  bool core_dumped = false;  // only when `signaled`

  // From the siginfo_t that waitid(..., WEXITED) filled in for an exited child.
  static ExitStatus from_siginfo(const siginfo_t& info);

  // "exited with status 3", "killed by signal SIGKILL (9)",
  // "killed by signal SIGSEGV (11) (core dumped)".
  std::string to_string() const;

  bool operator==(const ExitStatus&) const = default;
};

}  // namespace podium::host
