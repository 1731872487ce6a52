// podium::host::spawn_process — start one OS process quickly and safely.
//
// The mechanism under ChildWatcher; most callers want ChildWatcher, which also watches and
// reaps. spawn_process vforks (the parent thread sleeps until the child execs, no page tables
// are copied) and returns only after the child has exec'd or failed:
//   - a failure in the child before or at execve (chdir, fd setup, execve itself) comes back
//     through a close-on-exec pipe as HostErrc::kExecFailed naming the step and the errno
//     text; that child is reaped here.
//   - between vfork and execve the child only reads memory prepared by the parent and makes
//     async-signal-safe system calls (no malloc, no locks). All signals are blocked around
//     vfork; the child resets every disposition to SIG_DFL and starts with an empty mask.
//   - every descriptor of the parent is close-on-exec in the child except 0, 1, 2 and the
//     ChildSpec::fds targets.
// The caller of spawn_process owns the child: it must reap it.
//
//   HO-7 A spawn that runs out of descriptors (EMFILE, in this process or in the child before
//        exec) says so with this process's RLIMIT_NOFILE, soft and hard, and what raises it.
//
// Thread-safe (it touches no shared state), callable from any thread; but see die_with_parent.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "podium/base/error.h"
#include "podium/base/unique_fd.h"

namespace podium::host {

// Parent's descriptor `fd` becomes the child's descriptor `target` (e.g. a socket as fd 3).
struct PassFd {
  int fd = -1;
  int target = -1;
};

struct ChildSpec {
  std::string path;               // the executable; not searched in PATH
  std::vector<std::string> argv;  // argv[0] included; empty means {path}
  // Added to the parent's environment, replacing variables of the same name.
  std::vector<std::pair<std::string, std::string>> env;
  std::optional<std::string> cwd;  // unset: the parent's working directory
  // PR_SET_PDEATHSIG(SIGKILL): the kernel kills the child when its parent dies. Linux ties
  // this to the parent *thread*: spawn from a thread that lives as long as the child.
  bool die_with_parent = true;
  // setpgid(0, 0): the child leads a new process group, so its whole tree can be signalled.
  bool new_process_group = true;
  // setsid(): the child leads a new session (and a new process group in it), detached from
  // the parent's controlling terminal; what it starts stays in that session unless it calls
  // setsid itself. Implies a process group of its own, whatever new_process_group says.
  bool new_session = false;
  // stdout and stderr go to pipes (SpawnedProcess::out/err); otherwise they are inherited.
  bool capture_output = false;
  std::vector<PassFd> fds;  // targets must be distinct; 1 and 2 not with capture_output
};

struct SpawnedProcess {
  pid_t pid = -1;
  UniqueFd out;  // read ends of the stdout/stderr pipes when capture_output, else empty
  UniqueFd err;
};

[[nodiscard]] Result<SpawnedProcess> spawn_process(const ChildSpec& spec);

}  // namespace podium::host
