// podium::host zygote: a warm process per host that forks procs, instead of starting each
// proc as a cold interpreter.
//
// A runtime that is slow to start (a Python interpreter that imports podium, NumPy, torch)
// starts once as the zygote, then forks every proc from that warm image: a fork costs a few
// milliseconds where an interpreter start and its imports cost hundreds. The zygote is a
// child of the controller (spawned by its ChildWatcher, so PR_SET_PDEATHSIG ties it to the
// controller); its children are the procs.
//
// Server: zygote_serve() runs in the zygote, which must be single-threaded (fork copies only
// the calling thread). It returns in each forked child, with what the controller asked for
// (argv, the whole environment, the working directory), so the caller turns into a proc.
// In the zygote itself it returns only when the controller's end of the socket closes.
//
// Client: Zygote, in the controller. spawn() forks a child and returns its pid; the child's
// exit reaches OnExit on an io_context thread with the status the zygote reaped.
//
// Wire (a SOCK_SEQPACKET socketpair, the zygote's end as its fd 3; one msgpack array per
// packet, docs/host.md):
//   controller -> zygote  ["spawn", id, argv, env, cwd, targets] (+ the fds, SCM_RIGHTS)
//   zygote -> controller  ["spawned", id, pid] | ["failed", id, why]
//                         ["exit", pid, signaled, code, core_dumped]
//
// Invariants (tests name them):
//   ZY-1 Every spawn() returns a pid or an error, within its timeout: a zygote that dies
//        fails the spawns in flight.
//   ZY-2 OnExit runs exactly once per child, with the status the zygote reaped (waitid); when
//        the zygote dies first, every child not yet reported is killed (its process group
//        SIGKILLed) and reported as killed by SIGKILL.
//   ZY-3 A child leads its own process group and dies with the zygote (PR_SET_PDEATHSIG,
//        checked against a zygote that died before the child armed it); the zygote dies
//        with the controller, and exits when the controller closes the socket.
//   ZY-4 The environment of a child is the one sent with the request (the controller's at
//        spawn time), not the zygote's.
//   ZY-6 Before it serves, the zygote backs its private anonymous memory with transparent huge
//        pages (MADV_COLLAPSE, best effort; PODIUM_ZYGOTE_HUGEPAGES=0 turns it off): a fork
//        then copies one page-table entry per 2 MiB instead of 512, and a proc's exit tears
//        down as few, so its death reaches the controller sooner. Only the page tables
//        change: the memory's contents are the same, and a kernel without MADV_COLLAPSE
//        (or a region it refuses) is left as it was.
//   ZY-5 The descriptors sent with a request are the child's at their targets (its fds 1, 2,
//        3: pipes whose read ends the controller holds); the zygote closes its copies at
//        once, so only the child (and what it starts) holds the write ends.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "podium/base/error.h"
#include "podium/host/child_watcher.h"

namespace asio {
class io_context;
}

namespace podium::host {

// What a forked child should become.
struct ZygoteChild {
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;  // the whole environment
  std::string cwd;                                       // empty: the zygote's
  // Controller side: the controller's descriptor `fd` becomes the child's `target` (its
  // stdout/stderr pipes, ZY-5). They travel with the request (SCM_RIGHTS); the child gets
  // them dup2'd onto their targets, and the zygote keeps none. In the child: empty.
  std::vector<PassFd> fds;
};

// Run around fork() in the zygote (a language runtime's own fork bookkeeping: Python's
// PyOS_BeforeFork / PyOS_AfterFork_Parent / PyOS_AfterFork_Child).
struct ForkHooks {
  std::function<void()> prepare;
  std::function<void()> parent;
  std::function<void()> child;
};

// ZY-6: collapses the private anonymous memory of this process (its heap and anonymous
// mappings, 2 MiB-aligned chunks only) into transparent huge pages. What it did: the chunks
// it tried and collapsed, and the first error (errno) of those it could not.
struct HugePageCollapse {
  size_t chunks = 0;
  size_t collapsed = 0;
  size_t bytes = 0;  // collapsed
  int first_error = 0;
};
HugePageCollapse collapse_anonymous_memory();

// The zygote's loop on `fd` (see above). Returns the child's request in each forked child
// (its fd and the zygote's signal handling are gone, SIGCHLD unblocked); in the zygote, an
// error once the controller closed the socket (kStopped) or the socket failed.
[[nodiscard]] Result<ZygoteChild> zygote_serve(int fd, const ForkHooks& hooks);

class Zygote {
 public:
  // Starts `spec` through `watcher` with the zygote's end of a new socketpair as fd 3 (its
  // command must call zygote_serve(3, ...)). Call it from the thread that spawns the
  // controller's children (PR_SET_PDEATHSIG is per thread).
  [[nodiscard]] static Result<std::shared_ptr<Zygote>> start(asio::io_context& io,
                                                             ChildWatcher& watcher,
                                                             ChildSpec spec);
  ~Zygote();
  Zygote(const Zygote&) = delete;
  Zygote& operator=(const Zygote&) = delete;

  // Forks a child that becomes `child`; returns its pid once the zygote has forked it, or
  // an error (the zygote is gone, or did not answer within `timeout`: ZY-1). `on_exit` runs
  // once, on an io_context thread (ZY-2). Thread-safe.
  [[nodiscard]] Result<pid_t> spawn(const ZygoteChild& child, OnExit on_exit,
                                    std::chrono::milliseconds timeout = std::chrono::seconds(30));
  // Sends `sig` to a child's process group; kNoSuchChild once its exit was reported.
  [[nodiscard]] Status kill_group(pid_t pid, int sig);
  // The zygote process is running and answering.
  bool alive() const;
  // SIGKILLs every child's process group, then closes the socket (the zygote exits). Child
  // exits are still reported. Idempotent, thread-safe.
  void stop();

  class Impl;

 private:
  explicit Zygote(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;  // shared with pending io handlers
};

// The current environment of this process, as zygote requests carry it, with `overrides`
// replacing variables of the same name.
std::vector<std::pair<std::string, std::string>> current_environment(
    const std::vector<std::pair<std::string, std::string>>& overrides = {});

}  // namespace podium::host
