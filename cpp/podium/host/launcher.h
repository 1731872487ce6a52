// podium::host::launch_workers / stop_worker — start worker daemons that outlive the process
// that started them, learn where they listen, recognise them later (from another process
// too), and end each with everything it started.
//
// A worker runs in a session of its own (setsid), without PR_SET_PDEATHSIG: it outlives the
// controller that started it, so a later controller can re-attach. Its stdin is /dev/null;
// stdout and stderr are appended to a log file (a pipe to the controller would break, or
// block the worker, once the controller exits). Readiness is a handshake, not a log scan:
// the worker inherits the write end of a pipe as the descriptor named by PODIUM_READY_FD and
// writes its address there, one line, once it accepts connections (ReadyFd below is the
// worker's side). The launcher waits in poll(2) on the ready pipes and the workers' pidfds,
// so an exit or the address wakes it at once; nothing is polled on a clock.
//
// A process is identified by (pid, start time in clock ticks since boot, field 22 of
// /proc/PID/stat): a reused pid is never taken for the worker. Every signal goes through a
// pidfd opened and then checked against that identity (or against the session), so a pid
// that was reused between a /proc scan and the signal is never signalled. Ending a worker:
// SIGTERM to its process group, then, after a grace period (cut to kOrphanGrace once the
// worker itself has gone: what is left are orphans), SIGKILL to every process still in its
// session; procs the worker started in process groups of their own stay in its session, so
// none is orphaned.
//
// Threads: every function blocks its calling thread only, starts no thread and touches no
// shared state: thread-safe. The caller must not reap the workers behind the launcher's back
// (no waitpid(-1)); a worker that exits while its launcher lives stays a zombie until
// stop_worker reaps it or the launcher exits.
//
// Invariants (tests name them):
//   WP-1 launch_workers returns only once every worker wrote its address to its ready fd, or
//        fails (HostErrc::kNotReady) naming the job, the worker, its exit status or the
//        timeout, and its log's tail; then no process of the attempt is left.
//   WP-2 stop_worker returns only when no live process of the worker's session is left, or
//        fails (HostErrc::kSurvived) naming the pids that are.
//   WP-3 A signal reaches only the process it is meant for: the worker only while its pid
//        has the recorded start time, a session member only while it is in the session (a
//        pidfd checked after opening). A stop aimed at an older process with a reused pid
//        signals nothing.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "podium/base/error.h"
#include "podium/host/error.h"

namespace podium::host {

// The environment variable that names the worker's ready descriptor.
inline constexpr const char* kReadyFdEnv = "PODIUM_READY_FD";
// The descriptor number the launcher gives the ready pipe in the worker.
inline constexpr int kReadyFd = 3;
// Once the worker itself has gone, what is left of its session gets this much more grace.
inline constexpr std::chrono::milliseconds kOrphanGrace{500};
// How long stop_worker waits for SIGKILLed processes to go before it reports them.
inline constexpr std::chrono::milliseconds kKillWait{5000};

struct WorkerSpec {
  std::string path;               // the executable; not searched in PATH
  std::vector<std::string> argv;  // argv[0] included; empty means {path}
  // Added to the launcher's environment, replacing variables of the same name.
  std::vector<std::pair<std::string, std::string>> env;
  std::string log;  // stdout and stderr are appended here (created with mode 0644 - umask)
};

struct WorkerId {
  pid_t pid = 0;
  uint64_t start_time = 0;  // /proc/PID/stat field 22
  bool operator==(const WorkerId&) const = default;
};

struct LaunchedWorker {
  WorkerId id;
  std::string address;  // the line the worker wrote to its ready fd, without the '\n'
};

// Starts every spec (each in a new session), then waits at most `timeout` for all of them
// to write their address (WP-1). `job` names the job in errors. Blocks; thread-safe.
[[nodiscard]] Result<std::vector<LaunchedWorker>> launch_workers(
    std::string_view job, const std::vector<WorkerSpec>& specs,
    std::chrono::milliseconds timeout);

// Ends the session of worker `id` (WP-2, WP-3): SIGTERM to its process group, SIGKILL to
// every member of its session left after `grace`. With no start_time the pid is taken to be
// the worker as it is now. Reaps the worker when it is a child of this process. Blocks;
// thread-safe.
[[nodiscard]] Status stop_worker(pid_t pid, std::optional<uint64_t> start_time,
                                 std::chrono::milliseconds grace);

// Whether a live (not zombie) process `id.pid` exists with that start time.
[[nodiscard]] bool worker_alive(const WorkerId& id);

// The start time of live process `pid` (/proc/PID/stat field 22), or nullopt when there is
// none or it is a zombie.
[[nodiscard]] std::optional<uint64_t> process_start_time(pid_t pid);

// The worker's side of the handshake: writes `address` and '\n' to the descriptor named by
// PODIUM_READY_FD, closes it and unsets the variable (so the worker's own children inherit
// neither). Does nothing when the variable is unset (a worker started by hand). Not
// thread-safe against other uses of the environment.
[[nodiscard]] Status announce_ready(std::string_view address);

}  // namespace podium::host
