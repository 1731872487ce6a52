// podium::host::DeathWatch — learns that a child is dying when its exit begins, not when it
// has been reaped.
//
// The kernel tears a dying process's memory down before its pidfd (or SIGCHLD, or the close
// of its sockets) says anything: for a proc with torch loaded that is 10 to 30 ms, and more
// when the cores are busy. A robust futex is told sooner: when a thread exits, before its
// memory goes, the kernel marks every futex word on the thread's robust list FUTEX_OWNER_DIED
// and wakes its waiters. So each child gets a slot in a memfd shared with its spawner
// (inherited as fd kChildFd, named in the child's kEnv as "FD:SLOT"); attach() (in the child)
// starts a thread that owns the slot's word through its robust list; the spawner's watcher
// thread waits on every watched word (futex_waitv) and, once one is marked, reads the dying
// thread's exit code (/proc/PID/task/TID/stat, set before its memory is released; once that
// thread is gone, the leader's, re-read every 200 us until certain) and calls that child's
// OnDying with the status the reap will report. Measured: the notice comes 2 to 4 ms after a
// proc's death where the reap comes 12 to 30 ms (docs/host.md).
//
// Threads: every public member is thread-safe; OnDying runs on the watcher thread, never
// under a lock of this class, and never after stop() returned.
//
// Invariants (tests name them):
//   DW-1 OnDying runs at most once per watch(), only for a child whose exit has begun (its
//        thread has PF_EXITING), with the status waitid(2) will report: "exited with status
//        N" or "killed by signal S"; a child that never attached (or a kernel without
//        futex_waitv) gets no call, and its reap is the only notice.
//   DW-2 A slot is reused only after release(): a released slot's word is cleared, so an
//        old child's mark never reaches a new one's OnDying.
//   DW-3 lower_dying(pid) sets every thread `pid` still has to nice kDyingNice (19). The
//        kernel tears a dying process's memory down on its thread that exits last, at that
//        thread's priority (4 to 7 ms of CPU for a proc forked from a torch zygote,
//        docs/host.md); lowered, that CPU goes to the live procs on a busy machine. The
//        runtime lowers a proc whose death nobody asked for, once OnDying told it the exit
//        has begun (Runtime::Impl::on_dying; PODIUM_DYING_NICE=0 turns it off): a proc being
//        stopped keeps its priority, so that a stop waiting for its reap is not slowed.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <optional>
#include <thread>
#include <vector>

#include "podium/base/error.h"
#include "podium/host/error.h"
#include "podium/host/exit_status.h"

namespace podium::host {

class DeathWatch {
 public:
  using OnDying = std::function<void(const ExitStatus&)>;
  static constexpr const char* kEnv = "PODIUM_DEATH_WATCH";
  static constexpr int kChildFd = 4;  // the memfd's number in a child
  static constexpr size_t kSlots = 127;  // futex_waitv takes 128 words: these and a control
  static constexpr int kDyingNice = 19;  // DW-3

  // The memfd and the watcher thread; an error where the kernel lacks memfd or futex_waitv.
  [[nodiscard]] static Result<std::unique_ptr<DeathWatch>> create();
  ~DeathWatch();  // stop()
  DeathWatch(const DeathWatch&) = delete;
  DeathWatch& operator=(const DeathWatch&) = delete;

  // The memfd (close-on-exec here: pass it to a child as kChildFd).
  int fd() const { return fd_; }
  // A free slot for a child about to be spawned (nullopt: all in use; the child is then only
  // reaped). Its kEnv value is env_value(slot).
  std::optional<size_t> reserve();
  static std::string env_value(size_t slot);
  // Watches `slot`, reserved for the child `pid`, now spawned.
  void watch(size_t slot, pid_t pid, OnDying on_dying);
  // The child of `slot` was reaped (or never started): the slot is free again (DW-2).
  void release(size_t slot);
  // Joins the watcher; no OnDying runs after it returns. Idempotent.
  void stop();
  // DW-3: every thread of `pid` to nice kDyingNice (those gone meanwhile are skipped).
  static void lower_dying(pid_t pid);

 private:
  struct Watched {
    pid_t pid = 0;
    OnDying on_dying;
    bool reserved = false;
    bool told = false;
  };
  DeathWatch(int fd, void* base);
  void loop();
  void bump();  // wakes the watcher to look at the slots again

  const int fd_;
  void* const base_;
  std::atomic<uint32_t> control_{0};  // changed (and woken) by watch/release/stop
  std::mutex mu_;                     // guards slots_ and stopping_; a leaf
  std::vector<Watched> slots_;
  bool stopping_ = false;
  bool pending_ = false;  // the watcher's own: a marked process's status is not certain yet
  std::thread thread_;
};

// In a child: attaches to the slot kEnv names, if any, and unsets kEnv (DW-1). Without kEnv,
// or with a descriptor that is not the spawner's memfd, does nothing and says why.
Status attach_death_watch();

}  // namespace podium::host
