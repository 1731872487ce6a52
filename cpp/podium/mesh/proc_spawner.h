// podium::mesh::ProcSpawner — starts this process's procs (exec'd, or forked from a zygote)
// and signals their process groups; podium::mesh::JobThread — one thread that runs jobs in
// order and is joined when it stops.
//
// PR_SET_PDEATHSIG fires when the *thread* that spawned a child exits, so every child is
// spawned from the spawner's JobThread, which lives as long as the runtime. The zygote
// (InitOptions::zygote_argv, host/zygote.h) is started on that thread at the first spawn and
// again when it died; one that cannot start is logged once, and procs are exec'd from then on.
//
// Threads: every member is thread-safe. JobThread::run() from the job thread itself runs the
// job inline (no self-deadlock).
// Locks: JobThread::mu_ guards its queue and state; ProcSpawner::mu_ guards zygote_,
// zygote_failed_ and the death watch's pointer. Both are leaves: nothing else is locked under
// them, and no job runs under them.
// Invariants:
//   PS-1 No wait on the spawner is unbounded: run() returns the job's result, or fails
//        (MeshErrc::kSpawnFailed) when the job did not start within its timeout, or
//        (MeshErrc::kShutDown) once stop() began; a job not started by then never runs, so
//        nothing it refers to is touched after run() returned. A job that started is waited
//        for (a fork is bounded).
//   PS-2 stop() returns once the thread has ended and been joined; jobs queued behind it are
//        dropped with kShutDown, and post()/run() after it refuse at once.
//   PS-3 At most one zygote is live: callers that ask for it at once share the one the first
//        of them started (its start and the check for a live one are one job on the thread).
//   PS-4 Every proc's fds 1 and 2, and its log-only fd (PODIUM_PROC_LOG_FD, 3), are pipes
//        whose read ends this process holds (host/output_pump.h): their lines go to the
//        proc's log file, <log dir>/proc-<pid>.log, and fds 1 and 2 on to the sink (by
//        default this process's own fds 1 and 2, or the output fds). Forked or exec'd alike.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "podium/base/error.h"
#include "podium/host/death_watch.h"
#include "podium/host/child_watcher.h"
#include "podium/host/output_pump.h"
#include "podium/host/spawn.h"
#include "podium/mesh/errc.h"
#include "podium/mesh/launch.h"

namespace asio {
class io_context;
}
namespace podium::host {
class Zygote;
}

namespace podium::mesh {

class JobThread {
 public:
  explicit JobThread(std::string name) : name_(std::move(name)) {}
  ~JobThread() { stop(); }
  JobThread(const JobThread&) = delete;
  JobThread& operator=(const JobThread&) = delete;

  void start();
  // Queues `job`; false (not queued) once stop() began.
  bool post(std::function<void()> job);
  // Runs `f` on the thread and returns what it returned (PS-1).
  template <class T>
  Result<T> run(std::function<Result<T>()> f, std::chrono::milliseconds timeout);
  // PS-2. Idempotent.
  void stop();
  bool on_this_thread() const { return std::this_thread::get_id() == id_; }

 private:
  struct Job {
    std::function<void()> run;
    std::function<void()> cancel;  // run() by stop() for a job that never started; may be empty
    bool started = false;          // mu_
  };
  void main();

  const std::string name_;
  std::thread thread_;
  std::thread::id id_;
  std::mutex mu_;  // guards jobs_, stopping_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> jobs_;
  bool stopping_ = false;
};

template <class T>
Result<T> JobThread::run(std::function<Result<T>()> f, std::chrono::milliseconds timeout) {
  if (on_this_thread()) return f();
  struct Slot {
    std::mutex m;
    std::condition_variable cv;
    std::optional<Result<T>> out;
  };
  auto slot = std::make_shared<Slot>();
  auto job = std::make_shared<Job>();
  // `f` refers to the caller's frame: it runs only while the caller waits (PS-1).
  job->run = [slot, &f] {
    auto r = f();
    std::lock_guard l(slot->m);
    slot->out.emplace(std::move(r));
    slot->cv.notify_all();
  };
  job->cancel = [slot, name = name_] {
    std::lock_guard l(slot->m);
    if (!slot->out) {
      slot->out.emplace(std::unexpected(make_error(MeshErrc::kShutDown, name + " thread stopped")));
    }
    slot->cv.notify_all();
  };
  {
    std::lock_guard lock(mu_);
    if (stopping_) {
      return std::unexpected(make_error(MeshErrc::kShutDown, name_ + " thread has stopped"));
    }
    jobs_.push_back(job);
  }
  cv_.notify_all();
  std::unique_lock l(slot->m);
  if (slot->cv.wait_for(l, timeout, [&] { return slot->out.has_value(); })) {
    return std::move(*slot->out);
  }
  l.unlock();
  {
    std::lock_guard lock(mu_);
    if (!job->started) {
      std::erase(jobs_, job);
      return std::unexpected(make_error(
          stopping_ ? MeshErrc::kShutDown : MeshErrc::kSpawnFailed,
          name_ + " thread did not run the job within " + std::to_string(timeout.count()) +
              " ms" + (stopping_ ? " (it stopped)" : "")));
    }
  }
  l.lock();
  slot->cv.wait(l, [&] { return slot->out.has_value(); });  // started: bounded by the job
  return std::move(*slot->out);
}

// How a proc is started: its command, and what its environment says.
struct ProcCommand {
  std::vector<std::pair<std::string, std::string>> env;  // e.g. PODIUM_BOOT
  // Its own command, environment and binding (launch.h); empty: the default. A proc with a
  // program of its own is exec'd, never forked from the zygote.
  ProcLaunch launch;
};

class ProcSpawner {
 public:
  // `proc_argv`: the command that starts a proc (empty: this binary); `zygote_argv`: the
  // zygote's (empty: none). Both are fixed here, before any spawn.
  ProcSpawner(asio::io_context& io, host::ChildWatcher& watcher,
              std::vector<std::string> proc_argv, std::vector<std::string> zygote_argv);
  ~ProcSpawner();

  void start();
  // Stops the zygote (SIGKILL to every proc forked from it) and joins the thread (PS-2).
  // The watcher's own children are the caller's (ChildWatcher::stop).
  void stop();

  // A host agent's procs write to these fds as their stdout and stderr (HA-6); set before
  // the first spawn.
  void set_output_fds(int out, int err);
  // Where what procs write to fds 1 and 2 goes after their log file (PS-4); set before the
  // first spawn. Runs on the pumps' thread; must not block for long.
  void set_output_sink(host::OutputPumps::Sink sink);
  // Ends the output pumps: waits up to `grace` for the procs' pipes to close, drains them
  // (OP-2). Call after the procs were killed (ChildWatcher::stop). Idempotent.
  void stop_output(std::chrono::milliseconds grace = std::chrono::milliseconds(1000));

  // Starts one proc with `env` added to its environment; `on_exit` runs once when it ends
  // (reaped). `on_dying`, if given, runs (on an io thread) when its exit has begun, with the
  // status the reap will give, as soon as the death watch can tell (host/death_watch.h,
  // DW-1): 10 to 30 ms before the reap for a proc with torch loaded. It may not run at all.
  [[nodiscard]] Result<pid_t> spawn(const ProcCommand& cmd, host::OnExit on_exit,
                                    host::OnExit on_dying = {});
  // `sig` to a proc's process group, whether forked from the zygote or exec'd.
  bool kill_group(pid_t pid, int sig);

  // start() raises this process's soft RLIMIT_NOFILE to this (or the hard limit) (PS-4).
  static constexpr uint64_t kWantedFds = 1 << 16;
  // How long a spawn waits for the spawner thread to take it (PS-1).
  static constexpr std::chrono::seconds kSpawnWait{30};

 private:
  std::shared_ptr<host::Zygote> zygote_for_spawn();
  void add_output_fds(host::ChildSpec& spec) const;
  void pump(pid_t pid, host::ProcPipes pipes, const std::string& log_dir);
  void emit(int stream, std::string_view data) const;
  static void apply_launch(const ProcLaunch& launch, host::ChildSpec& spec);

  asio::io_context& io_;
  host::ChildWatcher& watcher_;
  const std::vector<std::string> proc_argv_;  // argv[0] is the absolute executable
  const std::vector<std::string> zygote_argv_;
  const std::string spawn_env_;  // both, as PODIUM_SPAWN carries them (BT-3)
  int out_fd_[2] = {-1, -1};  // set before the first spawn; immutable after
  host::OutputPumps::Sink sink_;  // likewise
  std::unique_ptr<host::OutputPumps> pumps_;
  JobThread thread_{"the spawner"};
  std::mutex mu_;  // guards zygote_, zygote_failed_, death_watch_ and its flags
  std::shared_ptr<host::Zygote> zygote_;
  bool zygote_failed_ = false;
  // The death watch (made at the first spawn; null where the kernel has no futex_waitv); its
  // memfd is every child's fd kChildFd. Guarded by mu_.
  std::shared_ptr<host::DeathWatch> death_watch();
  std::shared_ptr<host::DeathWatch> death_watch_;
  bool death_watch_failed_ = false;
  bool stopped_ = false;
};

// This binary's path (/proc/self/exe resolved).
std::string self_exe();

}  // namespace podium::mesh
