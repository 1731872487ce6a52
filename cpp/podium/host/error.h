// Error codes of the host layer (process spawning and watching).
#pragma once

#include <cstdint>

#include "podium/base/error.h"

namespace podium::host {

enum class HostErrc : uint16_t {
  kInvalidSpec = 100,     // a ChildSpec that cannot be honoured (bad fd plan, empty path, ...)
  kSpawnFailed = 101,     // a system call in the parent failed (pipe2, vfork, pidfd_open)
  kExecFailed = 102,      // the child failed before or at execve; the message has the errno
  kNoSuchChild = 103,     // the pid is not a live (unreaped) child of this watcher
  kNoProcessGroup = 104,  // kill_group on a child that shares the parent's process group
  kSignalFailed = 105,    // kill(2) failed
  kStopped = 106,         // the watcher was stopped
  kNotReady = 107,        // a launched worker exited, or did not write its address in time
  kSurvived = 108,        // processes of a worker's session outlived SIGKILL (launcher.h)
};
constexpr Subsystem subsystem_of(HostErrc) { return Subsystem::kHost; }

}  // namespace podium::host
