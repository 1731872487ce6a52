// podium::host::ChildWatcher — spawns procs (OS processes) and watches them until reaped.
//
// spawn() starts a process (spawn.h: vfork + execve, exec failures reported synchronously)
// and registers its pidfd with the caller's io_context: the exit wakes the loop at once, the
// child is reaped with waitid(2) and OnExit gets its ExitStatus. With capture_output, stdout
// and stderr are read from pipes and handed to OnOutputLine line by line. Kernels without
// pidfd_open (ENOSYS, before 5.3) are watched through SIGCHLD instead.
//
// Threads: the caller owns the io_context and runs it on one or more threads. spawn(), kill(),
// kill_group(), kill_all(), terminate_all(), alive() and stop() are thread-safe, and may be
// called from the callbacks. Callbacks run on io_context threads; those of one child never run
// concurrently, those of different children may.
//
// Precondition: nothing else in the process reaps these children (no waitpid(-1), SIGCHLD not
// SIG_IGN). A child reaped behind the watcher's back is logged and gets no OnExit.
//
// Invariants (tests name them):
//   HO-1 OnExit runs exactly once per spawned child, after it is reaped, unless stop() (or the
//        destructor) reaps it first; no callback of any kind runs once stop() has returned.
//   HO-2 Exit is noticed by an event on the child's pidfd (or SIGCHLD), never by polling.
//   HO-3 No zombies, no orphans: every child is reaped; stop() and the destructor SIGKILL each
//        child's process group and reap the child before returning; with die_with_parent the
//        kernel kills the child if this process dies.
//   HO-4 Signals reach only unreaped children (signalling and reaping hold one mutex), so a
//        recycled pid is never signalled.
//   HO-5 Every byte a child wrote to its captured stdout/stderr before exiting is delivered
//        before its OnExit, in lines of at most 64 KiB (longer lines are split, a last line
//        without '\n' is flushed). Capture ends when the child exits: no output callback
//        for it runs after its OnExit.
//   HO-6 spawn() returns after the child has exec'd; if it could not (missing binary, bad cwd,
//        ...) it returns kExecFailed with the errno text and leaves no process behind.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string_view>

#include "podium/base/error.h"
#include "podium/host/error.h"
#include "podium/host/exit_status.h"
#include "podium/host/spawn.h"

namespace asio {
class io_context;
}

namespace podium::host {

enum class Stream : uint8_t { kStdout, kStderr };

using OnExit = std::function<void(const ExitStatus&)>;
// `line` excludes the '\n' and is valid only during the call.
using OnOutputLine = std::function<void(pid_t pid, Stream stream, std::string_view line)>;

// kAuto: pidfd, or SIGCHLD when the kernel has no pidfd_open. kSigchld forces the fallback
// (it exists so that the tests cover it).
enum class ExitWatch : uint8_t { kAuto, kSigchld };

class ChildWatcher {
 public:
  // Does no I/O.
  explicit ChildWatcher(asio::io_context& io, ExitWatch watch = ExitWatch::kAuto);
  // stop(): kills and reaps every child still alive.
  ~ChildWatcher();
  ChildWatcher(const ChildWatcher&) = delete;
  ChildWatcher& operator=(const ChildWatcher&) = delete;

  // Starts `spec` (HO-6). `on_output` is required with spec.capture_output. Thread-safe.
  [[nodiscard]] Result<pid_t> spawn(const ChildSpec& spec, OnExit on_exit,
                                    OnOutputLine on_output = {});

  // Sends `sig` to the child, or to its process group (kNoProcessGroup unless it was spawned
  // with new_process_group). kNoSuchChild once it has been reaped (HO-4). Thread-safe.
  [[nodiscard]] Status kill(pid_t pid, int sig);
  [[nodiscard]] Status kill_group(pid_t pid, int sig);

  // Sends `sig` to every child's process group (to the child alone without one). Thread-safe.
  void kill_all(int sig);

  // SIGTERM to every child's group now, SIGKILL to those still alive after `grace`. `done`
  // runs on an io thread once every child alive at the call has been reaped and its OnExit
  // has run (at once, through the io_context, if there is none). Thread-safe.
  void terminate_all(std::chrono::milliseconds grace, std::function<void()> done);

  // Children spawned and not yet reaped. Thread-safe.
  [[nodiscard]] size_t alive() const;

  // SIGKILLs every child's group and reaps the children, without OnExit; waits for callbacks
  // running on other threads; pending terminate_all callbacks are dropped; spawn() fails
  // with kStopped afterwards (HO-1, HO-3). Thread-safe, idempotent, callable from a callback.
  void stop();

 private:
  class Impl;
  std::shared_ptr<Impl> impl_;  // shared with pending io handlers
};

}  // namespace podium::host
