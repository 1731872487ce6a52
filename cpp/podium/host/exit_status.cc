#include "podium/host/exit_status.h"

#include <string.h>

namespace podium::host {

ExitStatus ExitStatus::from_siginfo(const siginfo_t& info) {
  ExitStatus s;
  s.pid = info.si_pid;
  s.signaled = info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED;
  s.code = info.si_status;
  s.core_dumped = info.si_code == CLD_DUMPED;
  return s;
}

std::string ExitStatus::to_string() const {
  if (!signaled) return "exited with status " + std::to_string(code);
  std::string out = "killed by signal ";
  if (const char* abbrev = sigabbrev_np(code)) {
    out += "SIG";
    out += abbrev;
    out += " (" + std::to_string(code) + ")";
  } else {
    out += std::to_string(code);
  }
  if (core_dumped) out += " (core dumped)";
  return out;
}

}  // namespace podium::host
