#include "podium/mesh/runtime.h"
#include "podium/base/log.h"

#include <spdlog/spdlog.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <list>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "podium/actor/executor.h"
#include "podium/channel/net.h"
#include "podium/actor/message.h"
#include "podium/host/child_watcher.h"
#include "podium/host/zygote.h"
#include "podium/mesh/cast.h"
#include "podium/mesh/grace_timer.h"
#include "podium/mesh/job_config.h"
#include "podium/mesh/proc_registry.h"
#include "podium/mesh/relay.h"
#include "podium/mesh/supervisor.h"

namespace podium {
namespace mesh {
namespace {

constexpr const char* kBootEnv = "PODIUM_BOOT";
// How long shutdown() waits for another thread's shutdown to finish (ME-10).
constexpr std::chrono::seconds kShutdownWait{30};

std::mutex g_mu;                     // guards g_runtime
std::unique_ptr<Runtime> g_runtime;  // set by init()
std::atomic<Runtime*> g_current{nullptr};  // g_runtime.get(), read without the lock
InitOptions g_options;  // set once by init()/init_controller(), before any spawn
std::function<void(actor::MeshFailure)> g_fault_handler;  // guarded by g_mu; empty: default

Error runtime_error(std::string msg) {
  return make_error(actor::ActorErrc::kProcExited, std::move(msg));
}

// "vm (tcp:10.0.0.2:7000)", or the worker's address before it attached.
std::string host_title(const HostState& host) {
  std::string worker = host.worker.to_string();
  return host.hostname.empty() ? worker : host.hostname + " (" + worker + ")";
}

// The first host of `ranks` that cannot be used (it refused, is unreachable, was lost or was
// shut down), as the error of `what`.
std::optional<Error> unusable_host(HostMeshState& hosts, const std::vector<size_t>& ranks,
                                   const std::string& what) {
  std::lock_guard lock(hosts.mu);
  for (size_t h : ranks) {
    const auto& host = hosts.hosts[h];
    if (host.failure) {
      return runtime_error(what + ": host " + host_title(host) + " cannot be used: " +
                           *host.failure);
    }
  }
  return std::nullopt;
}

// A directory only this user can open: $XDG_RUNTIME_DIR or /tmp, then podium-<uid>/<pid>-<rand>.
Result<std::string> make_socket_dir() {
  std::string base = "/tmp";
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x && ::access(x, W_OK) == 0) base = x;
  std::string user_dir = base + "/podium-" + std::to_string(::getuid());
  if (::mkdir(user_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return std::unexpected(errno_error("mkdir " + user_dir, errno));
  }
  struct stat st{};
  if (::lstat(user_dir.c_str(), &st) != 0) return std::unexpected(errno_error("stat " + user_dir, errno));
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::getuid() || (st.st_mode & 077) != 0) {
    return std::unexpected(make_error(BaseErrc::kIo, user_dir +
                                                         " must be a directory owned by this user "
                                                         "with mode 0700"));
  }
  if (size_t n = internal::sweep_stale_socket_dirs(user_dir); n > 0) {
    spdlog::debug("podium: removed {} socket directories of ended controllers in {}", n, user_dir);
  }
  std::random_device rd;
  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%08x", rd());
  std::string dir = user_dir + "/" + std::to_string(::getpid()) + "-" + suffix;
  if (::mkdir(dir.c_str(), 0700) != 0) return std::unexpected(errno_error("mkdir " + dir, errno));
  return dir;
}

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("/proc/self/exe") : p.string();
}

}  // namespace

// The maps of procs and meshes (meshes, by_key, dead, reservations) and when they are dropped
// (ME-11) are the ProcRegistry base, guarded by `mu`.
struct Runtime::Impl : ProcRegistry {
  std::unique_ptr<actor::Proc> proc;
  std::unique_ptr<host::ChildWatcher> watcher;
  std::unique_ptr<Supervisor> supervisor;
  std::unique_ptr<Relay> relay;
  // The controller, in a proc: the one that spawned it, or the last to adopt it
  // ("adopt_procs", a controller re-attached to a persistent worker); guarded by mu.
  std::optional<channel::Address> parent;
  // The zygote procs fork from (InitOptions::zygote_argv), started by the first spawn;
  // guarded by spawn_mu. zygote_failed: it could not start, procs are exec'd.
  std::shared_ptr<host::Zygote> zygote;
  bool zygote_failed = false;
  std::string sock_dir;  // empty in workers
  std::string proc_key;  // proc->id().to_string(), immutable after make_runtime()

  std::mutex mu;  // guards everything below
  uint64_t next_mesh = 1;
  // Procs whose end is expected: their host was shut down (shutdown_hosts). Taken out when
  // the end is seen.
  std::unordered_set<std::string> released;
  uint64_t dead_generation = 0;                      // bumped whenever `dead` grows
  // ME-11: how long dead records outlive the last handle, and the timer that drops them.
  std::chrono::milliseconds dead_grace = dead_record_grace();
  std::unique_ptr<asio::steady_timer> sweep_timer;  // made by the first death; mu
  bool sweep_armed = false;
  std::list<std::weak_ptr<Collector>> collectors;
  size_t tracks_since_prune = 0;
  std::shared_ptr<ProcMeshState> local_mesh;
  // shutdown(): `stopping` once a thread has begun it, `shut_down` once the hosts are
  // detached (new work is refused from then on), `stopped` when it has finished;
  // `stopped_cv` tells a concurrent caller, who must not return before then (ME-10).
  bool stopping = false;
  bool shut_down = false;
  bool stopped = false;
  std::condition_variable stopped_cv;
  // ---- attached hosts (controller side; docs/host_agent.md) ----
  struct HostRef {
    std::shared_ptr<HostMeshState> mesh;
    size_t index = 0;
  };
  std::unordered_map<uint64_t, std::shared_ptr<HostMeshState>> host_meshes;  // by id; mu
  std::unordered_map<std::string, HostRef> by_worker;  // worker address text -> host; mu
  uint64_t next_host_mesh = 1;                           // mu
  // When each host was asked to attach, then last heard from; mu.
  std::unordered_map<HostMeshState*, std::vector<std::chrono::steady_clock::time_point>> heard;
  // A worker's answer: the procs it spawned ("host_spawned"), or those of a proc mesh it
  // keeps ("host_found": also the mesh's extent, its first rank here and how each ended).
  struct Spawned {
    std::vector<std::string> keys;
    std::vector<int64_t> pids;
    std::string extent;               // host_found: "label=size,..."
    uint64_t first = 0;               // host_found
    std::vector<std::string> exits;   // host_found: "" while alive
  };
  std::unordered_map<uint64_t, std::shared_ptr<actor::Promise<Spawned>>> spawn_requests;  // mu
  uint64_t next_request = 1;                                                              // mu
  std::unique_ptr<asio::steady_timer> host_timer;  // started by the first attach; mu
  std::chrono::milliseconds host_lost_after{3000};
  std::chrono::milliseconds attach_timeout{10000};

  // ---- host agent (worker side) ----
  struct Worker {
    std::optional<channel::Address> controller;  // the one served now
    std::string controller_key;
    uint64_t host_mesh = 0, host_index = 0;
    std::string advertise;  // the host name procs listen on: the one the controller dialled
    std::chrono::milliseconds lost_after{3000};
    std::chrono::steady_clock::time_point last_heard;
    struct Child {
      pid_t pid = -1;
      channel::PortReservation port;
    };
    std::unordered_map<std::string, Child> children;  // by proc key
    // Keep procs when the controller leaves or goes silent (WorkerOptions::persistent).
    bool persistent = false;
    // The proc meshes spawned here, in spawn order (HA-7): what a controller that attaches
    // later finds by name. A mesh leaves when all its procs have exited, unless named.
    struct Mesh {
      uint64_t serial = 0;     // this worker's own number for it
      bool spawning = true;    // its procs are being started: it stays, even with all exited
      std::string name;        // "" when spawned without one
      std::string extent;      // the whole mesh's, "label=size,..."
      uint64_t first = 0;      // its first rank on this host
      std::string controller;  // the controller it belongs to: its spawner or its adopter
      std::vector<std::string> keys;
      std::vector<int64_t> pids;
      std::vector<std::string> exits;  // "" while alive, else how it ended
      bool all_exited() const {
        return std::all_of(exits.begin(), exits.end(), [](const auto& e) { return !e.empty(); });
      }
    };
    std::vector<Mesh> meshes;
    uint64_t next_serial = 0;
    std::unique_ptr<asio::steady_timer> timer;
    // The procs' stdout and stderr (fds 1 and 2 of every proc and of the zygote) are these
    // pipes' write ends; what the read ends yield goes to the controller ("host_output").
    int out_fd[2] = {-1, -1};  // write ends, for children: stdout, stderr
    std::unique_ptr<asio::posix::stream_descriptor> out_reader[2];
    std::array<char, 16384> out_buf[2];
  };
  std::unique_ptr<Worker> worker;  // set in a host agent; its fields guarded by mu

  // PR_SET_PDEATHSIG fires when the *thread* that spawned a child exits, so every child is
  // spawned from this thread, which lives as long as the runtime.
  std::thread spawner;
  std::mutex spawn_mu;                              // guards spawn_jobs, spawner_stop
  std::condition_variable spawn_cv;
  std::deque<std::function<void()>> spawn_jobs;
  bool spawner_stop = false;

  void spawner_main() {
    std::unique_lock lock(spawn_mu);
    while (true) {
      spawn_cv.wait(lock, [&] { return spawner_stop || !spawn_jobs.empty(); });
      if (spawn_jobs.empty()) return;
      auto job = std::move(spawn_jobs.front());
      spawn_jobs.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }

  template <class F>
  auto on_spawner(F&& f) -> decltype(f()) {
    std::optional<decltype(f())> out;
    std::mutex m;
    std::condition_variable cv;
    {
      std::lock_guard lock(spawn_mu);
      spawn_jobs.push_back([&] {
        auto r = f();
        std::lock_guard l(m);
        out.emplace(std::move(r));
        cv.notify_one();
      });
    }
    spawn_cv.notify_one();
    std::unique_lock l(m);
    cv.wait(l, [&] { return out.has_value(); });
    return std::move(*out);
  }

  // The running zygote, started on the spawner thread (PR_SET_PDEATHSIG is per thread) on
  // first use; nullptr without one. A zygote that died is started again.
  std::shared_ptr<host::Zygote> zygote_for_spawn() {
    if (g_options.zygote_argv.empty()) return nullptr;
    {
      std::lock_guard lock(spawn_mu);
      if (zygote_failed) return nullptr;
      if (zygote && zygote->alive()) return zygote;
    }
    auto started = on_spawner([&]() -> Result<std::shared_ptr<host::Zygote>> {
      host::ChildSpec spec;
      spec.path = g_options.zygote_argv[0];
      spec.argv = g_options.zygote_argv;
      add_output_fds(spec);
      return host::Zygote::start(proc->io(), *watcher, spec);
    });
    std::lock_guard lock(spawn_mu);
    if (!started) {
      spdlog::warn("podium: cannot start the zygote ({}); procs start as new processes",
                   started.error().to_string());
      zygote_failed = true;
      return nullptr;
    }
    zygote = std::move(*started);
    return zygote;
  }

  // SIGKILL (or `sig`) to a proc's process group, wherever it was started from.
  bool kill_proc_group(pid_t pid, int sig) {
    std::shared_ptr<host::Zygote> z;
    {
      std::lock_guard lock(spawn_mu);
      z = zygote;
    }
    if (z && z->kill_group(pid, sig)) return true;
    return static_cast<bool>(watcher->kill_group(pid, sig));
  }

  void on_ready(const actor::SystemHeader& h) {
    if (h.numbers.size() != 3) return;
    std::shared_ptr<ProcMeshState> mesh;
    {
      std::lock_guard lock(mu);
      auto it = meshes.find(h.numbers[0]);
      if (it != meshes.end()) mesh = it->second.lock();
    }
    if (!mesh || h.numbers[1] >= mesh->procs.size()) return;
    bool all = false;
    {
      std::lock_guard lock(mesh->mu);
      auto& p = mesh->procs[h.numbers[1]];
      if (p.ready || p.exit) return;
      p.ready = true;
      all = ++mesh->ready_count == mesh->procs.size();
    }
    if (all) mesh->initialized_promise.set({});
  }

  // One-way messages that could not be delivered. Those to procs that have exited or are
  // being stopped are expected (an "exit" that the proc obeyed before acknowledging it).
  void on_undeliverable(const wire::Envelope& env, const Error& why) {
    bool expected = false;
    if (auto v = actor::split_port_id(env.dest)) {
      std::string key(v->addr);
      if (worker_undeliverable(key, why)) {
        spdlog::debug("podium: undeliverable to worker {}: {}", key, why.to_string());
        return;
      }
      std::lock_guard lock(mu);
      if (worker && worker->controller_key != key) {
        expected = true;  // a worker's answer to a controller it no longer serves
      } else if (dead.contains(key) || shut_down) {
        expected = true;
      } else if (auto it = by_key.find(key); it != by_key.end()) {
        if (auto mesh = it->second.mesh.lock()) {
          std::lock_guard mlock(mesh->mu);
          expected = mesh->stopping;
        }
      }
    }
    if (expected) {
      spdlog::debug("podium: undeliverable to a stopped proc: {}: {}", env.dest, why.to_string());
    } else {
      spdlog::warn("podium: undeliverable message from {} to {}: {}", env.sender, env.dest,
                   why.to_string());
    }
  }

  // "its proc (pid 42) was killed by signal SIGKILL (9)": the cause a caller sees.
  static std::string exit_cause(const host::ExitStatus& status) {
    return "its proc (pid " + std::to_string(status.pid) + ") " +
           (status.signaled ? "was " : "") + status.to_string();
  }

  void on_exit(const std::string& key, const host::ExitStatus& status) {
    {
      std::lock_guard lock(mu);
      reservations.erase(key);
    }
    proc_ended(key, status.pid, status.signaled ? status.code : 0,
               status.signaled ? -1 : status.code, status.to_string(), exit_cause(status));
  }

  // The proc `key` is gone: it exited (`how`: "exited with status 3") or its host was lost.
  // `cause` is what callers see ("its proc (pid 42) was killed by signal SIGKILL (9)").
  void proc_ended(const std::string& key, int64_t pid, int32_t sig, int32_t code,
                  const std::string& how, const std::string& cause) {
    std::shared_ptr<ProcMeshState> mesh;
    size_t rank = 0;
    std::string who;
    std::vector<channel::Address> others;
    bool down = false;
    bool was_released = false;
    {
      std::lock_guard lock(mu);
      down = shut_down;
      was_released = released.erase(key) > 0;
      auto it = by_key.find(key);
      if (it != by_key.end()) {
        mesh = it->second.mesh.lock();
        rank = it->second.rank;
      }
      who = "proc " + key + " (pid " + std::to_string(pid) + ")";
      if (mesh) {
        who = "proc rank " + std::to_string(rank);
        if (auto p = mesh->extent.point_of_rank(rank)) who += " " + p->to_string();
        who += " (pid " + std::to_string(pid) + ", " + key + ")";
      }
      // ME-7: every other live proc hears of it.
      for (const auto& [k, ref] : by_key) {
        if (k == key || dead.contains(k)) continue;
        auto m = ref.mesh.lock();
        if (!m) continue;
        std::lock_guard mlock(m->mu);
        if (!m->procs[ref.rank].exit && m->procs[ref.rank].pid > 0) {
          others.push_back(m->procs[ref.rank].id.addr);
        }
      }
    }
    bool expected = down || was_released;
    if (mesh) {
      std::lock_guard lock(mesh->mu);
      if (mesh->procs[rank].exit) return;  // told twice (its host lost, then its exit)
      mesh->procs[rank].exit = how;
      expected = expected || mesh->stopping;
    }
    if (!expected) spdlog::warn("podium: {} {}", who, how);
    if (mesh) mesh->initialized_promise.set(std::unexpected(runtime_error(who + " " + how)));
    if (!down) {
      for (const auto& addr : others) {
        proc->send(addr, actor::system_message(
                             actor::ProcId{addr},
                             actor::SystemHeader{
                                 "proc_exit",
                                 {key, cause},
                                 {static_cast<uint64_t>(pid), expected ? 1u : 0u,
                                  static_cast<uint64_t>(static_cast<uint32_t>(sig)),
                                  static_cast<uint64_t>(static_cast<uint32_t>(code))}}));
      }
    }
    // Calls still waiting when this process shuts down (its exit, with a failure being
    // reported on another thread) fail with the reason their procs went.
    proc_gone(key, pid, sig, code, down ? cause + " when this process shut down" : cause,
              expected);
  }

  // A proc ended (seen here, or told by the controller): calls waiting on it fail (ME-2), and
  // unless it was being stopped, the meshes owned here with an actor on it failed (SV-2).
  void proc_gone(const std::string& key, int64_t pid, int32_t sig, int32_t code,
                 const std::string& cause, bool expected) {
    std::vector<std::shared_ptr<Collector>> waiting;
    Error why = runtime_error(cause);
    {
      std::lock_guard lock(mu);
      if (!note_dead(key, why, std::chrono::steady_clock::now())) return;
      ++dead_generation;
      arm_sweep();
      for (auto& w : collectors) {
        if (auto c = w.lock()) waiting.push_back(std::move(c));
      }
    }
    // The owner hears first: a caller that sees its call fail and ends the program finds the
    // fault queued already (the unhandled fault hook still runs at exit).
    if (!expected) supervisor->proc_exited(key, pid, sig, code, cause);
    for (auto& c : waiting) c->proc_failed(key, why);
    relay->proc_gone(key, why);  // CT-4: casts that route through it go around it
    // CH-11: no link to it is kept; what is still queued there comes back as undeliverable,
    // which on_undeliverable expects for a dead proc.
    if (auto addr = channel::Address::parse(key)) {
      proc->forget_peer(*addr, "the proc at " + key + " has ended");
    }
  }

  // ME-11: the sweep runs when the oldest dead record's grace is over (at most four times a
  // grace period); under mu.
  void arm_sweep() {
    if (sweep_armed || shut_down) return;
    auto due = next_sweep(dead_grace);
    if (!due) return;
    if (!sweep_timer) sweep_timer = std::make_unique<asio::steady_timer>(proc->io());
    sweep_armed = true;
    sweep_timer->expires_at(std::max(*due, std::chrono::steady_clock::now() + dead_grace / 4));
    sweep_timer->async_wait([this](std::error_code ec) {
      if (!ec) sweep_dead();
    });
  }

  void sweep_dead() {
    std::vector<Dropped> dropped;
    {
      std::lock_guard lock(mu);
      sweep_armed = false;
      if (shut_down) return;
      dropped = sweep(std::chrono::steady_clock::now(), dead_grace);
      // The weak pointers of finished collectors hold their memory (make_shared) until
      // pruned; track() prunes every 256 calls, this when calls stop.
      collectors.remove_if([](const auto& w) { return w.expired(); });
      tracks_since_prune = 0;
      arm_sweep();
      // Under mu, as `dead` changed: shutdown_hosts reads both under it.
      for (const auto& d : dropped) {
        if (!d.host) continue;
        std::lock_guard hlock(d.host->mu);
        std::erase(d.host->hosts[d.host_index].proc_keys, d.key);
      }
    }
    if (dropped.empty()) return;
    std::vector<std::string> keys;
    for (auto& d : dropped) keys.push_back(std::move(d.key));
    proc->forget_dests(keys);
  }

  // "proc_exit" [key, cause] [pid, expected, signal, exit code] from the controller (ME-7).
  void on_proc_exit(const actor::SystemHeader& h) {
    if (h.args.size() != 2 || h.numbers.size() != 4) return;
    proc_gone(h.args[0], static_cast<int64_t>(h.numbers[0]),
              static_cast<int32_t>(static_cast<uint32_t>(h.numbers[2])),
              static_cast<int32_t>(static_cast<uint32_t>(h.numbers[3])), h.args[1],
              h.numbers[1] != 0);
  }

  // "actor_failed" [] [supervision id, base rank], part 1 = MeshFailure (actor layer SV-1).
  void on_actor_failed(const actor::SystemHeader& h, wire::Envelope&& env) {
    if (h.numbers.size() != 2 || env.parts.size() != 2) return;
    auto f = actor::decode_mesh_failure(env.parts[1]);
    if (!f) {
      spdlog::error("podium: bad failure report from {}: {}", env.sender, f.error().to_string());
      return;
    }
    supervisor->actor_failed(h.numbers[0], h.numbers[1], std::move(*f));
  }

  // "kill" [proc key]: a proc asks the controller to kill a proc whose actor did not stop.
  void on_kill(const actor::SystemHeader& h) {
    if (h.args.size() != 1) return;
    kill(h.args[0]);
  }

  void kill(const std::string& key) {
    int pid = -1;
    {
      std::unique_lock lock(mu);
      if (dead.contains(key)) return;
      auto it = by_key.find(key);
      if (it != by_key.end() && it->second.host) {
        auto host = it->second.host;
        size_t index = it->second.host_index;
        lock.unlock();
        kill_remote(host, index, key, SIGKILL);
        return;
      }
      if (it == by_key.end()) {
        if (parent) {  // not ours: the controller spawned it
          proc->send(*parent, actor::system_message(actor::ProcId{*parent},
                                                    actor::SystemHeader{"kill", {key}, {}}));
        }
        return;
      }
      if (auto m = it->second.mesh.lock()) {
        std::lock_guard mlock(m->mu);
        if (!m->procs[it->second.rank].exit) pid = m->procs[it->second.rank].pid;
      }
    }
    if (pid > 0) (void)kill_proc_group(pid, SIGKILL);
  }

  // SIGKILL (or `sig`) to the proc `key` (pid `pid`), here or through its host's agent.
  bool kill_any(const std::string& key, pid_t pid, int sig) {
    std::shared_ptr<HostMeshState> host;
    size_t index = 0;
    {
      std::lock_guard lock(mu);
      if (auto it = by_key.find(key); it != by_key.end() && it->second.host) {
        host = it->second.host;
        index = it->second.host_index;
      }
    }
    if (host) {
      kill_remote(host, index, key, sig);
      return true;
    }
    return kill_proc_group(pid, sig);
  }

  // ---- attached hosts (controller side) ----

  void send_to_worker(const channel::Address& worker, actor::SystemHeader h) {
    proc->send(worker, actor::system_message(actor::ProcId{worker}, std::move(h)));
  }

  void kill_remote(const std::shared_ptr<HostMeshState>& host, size_t index,
                   const std::string& key, int sig) {
    send_to_worker(host->hosts[index].worker,
                   actor::SystemHeader{"host_kill", {key}, {static_cast<uint64_t>(sig)}});
  }

  // The host (mesh, index) from a worker's message numbers [host mesh id, index, ...]; it was
  // heard from now.
  std::shared_ptr<HostMeshState> host_of(const actor::SystemHeader& h, size_t* index) {
    if (h.numbers.size() < 2) return nullptr;
    std::lock_guard lock(mu);
    auto it = host_meshes.find(h.numbers[0]);
    if (it == host_meshes.end() || h.numbers[1] >= it->second->hosts.size()) return nullptr;
    *index = h.numbers[1];
    auto& clock = heard[it->second.get()];
    clock[*index] = std::chrono::steady_clock::now();
    return it->second;
  }

  // "host_attached" [error, hostname] [host mesh id, index, worker pid].
  void on_host_attached(const actor::SystemHeader& h) {
    size_t index = 0;
    auto hm = host_of(h, &index);
    if (!hm || h.args.size() != 2) return;
    if (!h.args[0].empty()) {
      host_failed(hm, index, h.args[0]);
      return;
    }
    bool all = false;
    bool given_up = false;
    {
      std::lock_guard lock(hm->mu);
      auto& host = hm->hosts[index];
      if (host.attached) return;
      given_up = host.failure.has_value();
      if (!given_up) {
        host.attached = true;
        host.hostname = h.args[1];
        all = ++hm->attached_count == hm->hosts.size();
      }
    }
    if (given_up) {
      // HA-10: this controller gave up on the attach (it timed out); the worker must not stay
      // bound to it. host_tick sent a detach when it gave up; this one covers an answer that
      // crossed it.
      release_worker(hm->hosts[index].worker);
      return;
    }
    spdlog::debug("podium: attached host {} ({})", h.args[1], hm->hosts[index].worker.to_string());
    if (all) hm->initialized_promise.set({});
  }

  // A request to a worker: its id, and the future its answer ("host_spawned" or
  // "host_found") sets. Under mu.
  std::pair<uint64_t, actor::Future<Spawned>> new_request() {
    uint64_t req = next_request++;
    auto p = std::make_shared<actor::Promise<Spawned>>();
    spawn_requests[req] = p;
    return {req, p->future()};
  }

  // The request a worker's answer [error, ...] [request id, ...] completes, taken out of
  // spawn_requests; null when it is unknown, or when the answer is an error (set on it here).
  std::shared_ptr<actor::Promise<Spawned>> take_request(const actor::SystemHeader& h) {
    if (h.numbers.empty() || h.args.empty()) return nullptr;
    std::shared_ptr<actor::Promise<Spawned>> p;
    {
      std::lock_guard lock(mu);
      auto it = spawn_requests.find(h.numbers[0]);
      if (it == spawn_requests.end()) return nullptr;
      p = std::move(it->second);
      spawn_requests.erase(it);
    }
    if (!h.args[0].empty()) {
      p->set(std::unexpected(runtime_error(h.args[0])));
      return nullptr;
    }
    return p;
  }

  // "host_spawned" [error, proc keys...] [request id, pids...].
  void on_host_spawned(const actor::SystemHeader& h) {
    auto p = take_request(h);
    if (!p) return;
    if (h.args.size() != h.numbers.size()) {
      p->set(std::unexpected(runtime_error("malformed host_spawned answer")));
      return;
    }
    Spawned s;
    s.keys.assign(h.args.begin() + 1, h.args.end());
    for (size_t i = 1; i < h.numbers.size(); ++i) s.pids.push_back(static_cast<int64_t>(h.numbers[i]));
    p->set(std::move(s));
  }

  // "host_found" [error, extent, then key and exit per proc] [request id, first, pids...].
  void on_host_found(const actor::SystemHeader& h) {
    auto p = take_request(h);
    if (!p) return;
    if (h.args.size() < 2 || h.numbers.size() < 2 ||
        h.args.size() - 2 != 2 * (h.numbers.size() - 2)) {
      p->set(std::unexpected(runtime_error("malformed host_found answer")));
      return;
    }
    Spawned s;
    s.extent = h.args[1];
    s.first = h.numbers[1];
    for (size_t i = 2; i < h.args.size(); i += 2) {
      s.keys.push_back(h.args[i]);
      s.exits.push_back(h.args[i + 1]);
    }
    for (size_t i = 2; i < h.numbers.size(); ++i) s.pids.push_back(static_cast<int64_t>(h.numbers[i]));
    p->set(std::move(s));
  }

  // "host_proc_exit" [proc key] [host mesh id, index, pid, signaled, code].
  void on_host_proc_exit(const actor::SystemHeader& h) {
    size_t index = 0;
    auto hm = host_of(h, &index);
    if (!hm || h.args.size() != 1 || h.numbers.size() != 5) return;
    host::ExitStatus st;
    st.pid = static_cast<pid_t>(h.numbers[2]);
    st.signaled = h.numbers[3] != 0;
    st.code = static_cast<int>(h.numbers[4]);
    on_exit(h.args[0], st);
  }

  // The host cannot be used: it refused, did not answer, or was lost. Its procs fail (as if
  // they had exited, naming the host), and `initialized` fails if it has not resolved.
  void host_failed(const std::shared_ptr<HostMeshState>& hm, size_t index, const std::string& why) {
    std::vector<std::string> keys;
    std::string name, worker = hm->hosts[index].worker.to_string();
    bool was_attached = false;
    {
      std::lock_guard lock(hm->mu);
      auto& host = hm->hosts[index];
      if (host.failure) return;
      host.failure = why;
      was_attached = host.attached;
      name = host_title(host);
      keys = host.proc_keys;
    }
    std::string what = was_attached ? "host " + name + " was lost: " + why
                                    : "cannot attach host " + std::to_string(index) + " (" +
                                          worker + "): " + why;
    spdlog::error("podium: {}", what);
    hm->initialized_promise.set(std::unexpected(runtime_error(what)));
    for (const auto& key : keys) {
      int64_t pid = -1;
      {
        std::lock_guard lock(mu);
        auto it = by_key.find(key);
        // Dead, or dead and forgotten since `keys` was copied (ME-11): nothing to end.
        if (dead.contains(key) || it == by_key.end()) continue;
        if (auto m = it->second.mesh.lock()) {
          std::lock_guard mlock(m->mu);
          pid = m->procs[it->second.rank].pid;
        }
      }
      proc_ended(key, pid, 0, -1, "was lost with its host: " + why,
                 "its host " + name + " was lost: " + why);
    }
  }

  // Every host_lost_after / 6: heartbeats to the attached workers, and the verdicts on those
  // not heard from in time (lost) or that never answered the attach (unreachable).
  void host_tick() {
    using clock = std::chrono::steady_clock;
    auto now = clock::now();
    std::vector<std::pair<std::shared_ptr<HostMeshState>, size_t>> lost, unreachable;
    std::vector<std::pair<channel::Address, actor::SystemHeader>> beats;
    {
      std::lock_guard lock(mu);
      if (shut_down) return;
      for (auto& [id, hm] : host_meshes) {
        auto& clocks = heard[hm.get()];
        std::lock_guard mlock(hm->mu);
        for (size_t i = 0; i < hm->hosts.size(); ++i) {
          auto& host = hm->hosts[i];
          if (host.failure) continue;
          auto silent = now - clocks[i];
          if (!host.attached) {
            if (silent > attach_timeout) unreachable.emplace_back(hm, i);
          } else if (silent > host_lost_after) {
            lost.emplace_back(hm, i);
          } else {
            beats.emplace_back(host.worker, actor::SystemHeader{"host_hb", {proc_key}, {id, i}});
          }
        }
      }
    }
    for (auto& [addr, h] : beats) send_to_worker(addr, std::move(h));
    auto secs = [](std::chrono::milliseconds ms) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.1f s", ms.count() / 1000.0);
      return std::string(buf);
    };
    for (auto& [hm, i] : unreachable) {
      host_failed(hm, i, "no answer within " + secs(attach_timeout) +
                             " (unreachable, or not a podium worker)");
      release_worker(hm->hosts[i].worker);  // HA-10: an attach given up on is not adopted later
    }
    for (auto& [hm, i] : lost) {
      host_failed(hm, i, "no heartbeat for " + secs(host_lost_after));
    }
    arm_host_timer();
  }

  void arm_host_timer() {
    std::lock_guard lock(mu);
    if (shut_down || !host_timer) return;
    host_timer->expires_after(std::max(std::chrono::milliseconds(20), host_lost_after / 6));
    host_timer->async_wait([this](std::error_code ec) {
      if (!ec) host_tick();
    });
  }

  // HA-10: tells a worker this controller has given up on attaching it, so that an attach
  // that reaches it late (behind a flood, after a stall) is undone rather than adopted: the
  // worker serves no controller that no longer counts on it. Detach arrives after the attach
  // on the same link (CH-1); a worker that never got the attach ignores it.
  void release_worker(const channel::Address& worker) {
    uint64_t req = 0;
    {
      std::lock_guard lock(mu);
      if (shut_down) return;
      req = next_request++;  // nobody waits for its answer
    }
    send_to_worker(worker, actor::SystemHeader{"host_detach", {proc_key}, {req, 0}});
  }

  // A message to a worker came back. Before it attached, that is its answer (e.g. the secret
  // was refused); after, heartbeats decide.
  bool worker_undeliverable(const std::string& addr, const Error& why) {
    HostRef ref;
    {
      std::lock_guard lock(mu);
      auto it = by_worker.find(addr);
      if (it == by_worker.end()) return false;
      ref = it->second;
    }
    bool attached = false;
    {
      std::lock_guard lock(ref.mesh->mu);
      attached = ref.mesh->hosts[ref.index].attached;
    }
    if (attached) return true;
    std::string reason = why.message;
    if (why.is(channel::ChannelErrc::kAuthFailed) &&
        internal::secret_was_generated()) {
      reason += "; this controller runs on a secret it generated itself, since neither "
                "PODIUM_SECRET_FILE nor PODIUM_SECRET is set: start it with the workers' secret "
                "(docs/security.md)";
    }
    host_failed(ref.mesh, ref.index, reason);
    return true;
  }

  // Tells every attached worker this controller is leaving, and waits (bounded) until each
  // has stopped its procs, so that a next controller finds them free.
  void detach_hosts() {
    std::vector<std::shared_ptr<actor::Promise<Spawned>>> waits;
    std::vector<actor::Future<Spawned>> futures;
    {
      std::lock_guard lock(mu);
      for (auto& [id, hm] : host_meshes) {
        std::lock_guard mlock(hm->mu);
        for (size_t i = 0; i < hm->hosts.size(); ++i) {
          if (!hm->hosts[i].attached || hm->hosts[i].failure) continue;
          auto [req, answer] = new_request();
          futures.push_back(std::move(answer));
          proc->send(hm->hosts[i].worker,
                     actor::system_message(actor::ProcId{hm->hosts[i].worker},
                                           actor::SystemHeader{"host_detach", {proc_key},
                                                               {req, 0}}));
        }
      }
    }
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1000);
    for (auto& f : futures) {
      auto left = until - std::chrono::steady_clock::now();
      if (left <= std::chrono::nanoseconds(0)) break;
      (void)f.get(left);
    }
  }

  // ---- host agent (worker side) ----

  void worker_reply(const channel::Address& to, actor::SystemHeader h) {
    proc->send(to, actor::system_message(actor::ProcId{to}, std::move(h)));
  }

  // "host_attach" [controller key, advertised host] [host mesh id, index, lost after ms].
  // A peer's lost-after is clamped (HA-9): a controller that asks to be kept for days would
  // lock every other controller out of this worker long after it went away.
  static constexpr uint64_t kMinLostAfterMs = 100;
  static constexpr uint64_t kMaxLostAfterMs = 60 * 1000;
  static constexpr uint64_t kMaxProcsPerSpawn = 4096;
  void on_host_attach(const actor::SystemHeader& h) {
    if (h.args.size() != 2 || h.numbers.size() != 3) {
      spdlog::warn("podium worker: malformed host_attach ({} texts, {} numbers); ignored",
                   h.args.size(), h.numbers.size());
      return;
    }
    auto controller = channel::Address::parse(h.args[0]);
    if (!controller) {
      spdlog::warn("podium worker: bad attach from {}: {}", h.args[0],
                   controller.error().to_string());
      return;
    }
    std::string refusal;
    {
      std::lock_guard lock(mu);
      auto& w = *worker;
      if (w.controller && w.controller_key != h.args[0]) {
        refusal = "worker " + proc_key + " on host " + actor::host_name() +
                  " serves another controller (" + w.controller_key + ")";
      } else {
        w.controller = *controller;
        w.controller_key = h.args[0];
        w.advertise = h.args[1];
        w.host_mesh = h.numbers[0];
        w.host_index = h.numbers[1];
        uint64_t asked = h.numbers[2];
        uint64_t used = std::clamp<uint64_t>(asked, kMinLostAfterMs, kMaxLostAfterMs);
        if (used != asked) {
          spdlog::warn("podium worker: controller {} asked for a lost-after of {} ms; using {} ms",
                       h.args[0], asked, used);
        }
        w.lost_after = std::chrono::milliseconds(used);
        w.last_heard = std::chrono::steady_clock::now();
      }
    }
    if (refusal.empty()) {
      spdlog::info("podium worker: serving controller {}", h.args[0]);
    } else {
      spdlog::warn("podium worker: refused controller {}: {}", h.args[0], refusal);
    }
    worker_reply(*controller,
                 actor::SystemHeader{"host_attached", {refusal, actor::host_name()},
                                     {h.numbers[0], h.numbers[1],
                                      static_cast<uint64_t>(::getpid())}});
  }

  // Is `key` the controller served now? (Its heartbeat counts.)
  bool from_controller(const std::string& key) {
    std::lock_guard lock(mu);
    if (!worker->controller || worker->controller_key != key) return false;
    worker->last_heard = std::chrono::steady_clock::now();
    return true;
  }

  // "host_spawn" [controller key, mesh name, extent] [request id, mesh id, first rank, count]:
  // runs on a thread of its own (starting the zygote waits for the loop).
  void on_host_spawn(const actor::SystemHeader& h) {
    if (h.args.size() != 3 || h.numbers.size() != 4) {
      spdlog::warn("podium worker: malformed host_spawn ({} texts, {} numbers); ignored",
                   h.args.size(), h.numbers.size());
      return;
    }
    auto controller = channel::Address::parse(h.args[0]);
    if (!controller) return;
    if (!from_controller(h.args[0])) {
      worker_reply(*controller, actor::SystemHeader{"host_spawned",
                                                    {"worker " + proc_key +
                                                     " does not serve this controller"},
                                                    {h.numbers[0]}});
      return;
    }
    std::thread([this, h, to = *controller] { worker_spawn(h, to); }).detach();
  }

  // The mesh named `name` that this worker keeps with a proc alive, if any; mu held.
  Worker::Mesh* live_mesh_named(const std::string& name) {
    for (auto& m : worker->meshes) {
      if (m.name == name && !m.all_exited()) return &m;
    }
    return nullptr;
  }

  Worker::Mesh* mesh_by_serial(uint64_t serial) {  // mu held
    for (auto& m : worker->meshes) {
      if (m.serial == serial) return &m;
    }
    return nullptr;
  }

  void worker_spawn(actor::SystemHeader h, channel::Address to) {
    uint64_t req = h.numbers[0], mesh_id = h.numbers[1], first = h.numbers[2], count = h.numbers[3];
    std::string advertise, controller_key = h.args[0], name = h.args[1];
    auto refuse = [&](const std::string& why) {
      worker_reply(to, actor::SystemHeader{"host_spawned",
                                           {"host " + actor::host_name() + " (worker " +
                                            proc_key + "): " + why},
                                           {req}});
    };
    // HA-9: a count is checked before it is believed (each proc is a fork).
    if (count == 0 || count > kMaxProcsPerSpawn) {
      return refuse("asked for " + std::to_string(count) + " procs; a worker starts 1 to " +
                    std::to_string(kMaxProcsPerSpawn) + " per request");
    }
    uint64_t serial = 0;
    {
      // The mesh is recorded before its first child starts: an exit, however early, finds it.
      std::lock_guard lock(mu);
      advertise = worker->advertise;
      if (!name.empty()) {
        if (const auto* m = live_mesh_named(name)) {
          std::string why = "a proc mesh named '" + name + "' runs here already (" +
                            std::to_string(m->keys.size()) + " procs, controller " +
                            m->controller + "); stop it, or choose another name";
          return refuse(why);
        }
        // One whose procs all exited gives its name to the new one.
        std::erase_if(worker->meshes, [&](const Worker::Mesh& old) { return old.name == name; });
      }
      Worker::Mesh m;
      m.serial = serial = ++worker->next_serial;
      m.name = name;
      m.extent = h.args[2];
      m.first = first;
      m.controller = controller_key;
      worker->meshes.push_back(std::move(m));
    }
    auto done_spawning = [&] {
      std::lock_guard lock(mu);
      std::erase_if(worker->meshes, [&](Worker::Mesh& m) {
        if (m.serial != serial) return false;
        m.spawning = false;
        return m.name.empty() && m.all_exited();
      });
    };
    actor::SystemHeader answer{"host_spawned", {""}, {req}};
    std::vector<std::string> started;
    auto fail = [&](const std::string& why) {
      {
        std::lock_guard lock(mu);
        for (const auto& key : started) {
          if (auto it = worker->children.find(key); it != worker->children.end()) {
            (void)kill_proc_group(it->second.pid, SIGKILL);
          }
        }
        std::erase_if(worker->meshes, [&](const Worker::Mesh& m) { return m.serial == serial; });
      }
      refuse(why);
    };
    auto zygote = zygote_for_spawn();
    std::string cwd;
    if (zygote) {
      std::error_code ec;
      cwd = std::filesystem::current_path(ec).string();
    }
    std::string exe = g_options.proc_argv.empty() ? self_exe() : g_options.proc_argv[0];
    for (uint64_t r = first; r < first + count; ++r) {
      auto port = channel::PortReservation::make(advertise);
      if (!port) return fail(port.error().to_string());
      // A fresh incarnation: the port may have been a dead proc's (CH-12).
      std::string key = channel::Address{channel::Transport::kTcp, advertise, port->port(),
                                         channel::new_incarnation()}
                            .to_string();
      host::ChildSpec spec;
      spec.path = exe;
      spec.argv = g_options.proc_argv.empty() ? std::vector<std::string>{exe} : g_options.proc_argv;
      spec.env.emplace_back(kBootEnv, controller_key + ";" + key + ";" + std::to_string(mesh_id) +
                                          ";" + std::to_string(r) + ";reuse_port");
      add_output_fds(spec);
      auto on_exit = [this, key](const host::ExitStatus& s) { worker_child_exited(key, s); };
      Result<pid_t> pid = std::unexpected(Error{});
      {
        // The exit callback looks the child and its mesh up: register both under its lock.
        std::lock_guard lock(mu);
        worker->children.insert_or_assign(key, Worker::Child{-1, std::move(*port)});
        if (auto* m = mesh_by_serial(serial)) {
          m->keys.push_back(key);
          m->pids.push_back(-1);
          m->exits.emplace_back();
        }
      }
      if (zygote) {
        pid = zygote->spawn(host::ZygoteChild{spec.argv, host::current_environment(spec.env), cwd},
                            on_exit);
      } else {
        pid = on_spawner([&] { return watcher->spawn(spec, on_exit); });
      }
      if (!pid) {
        std::lock_guard lock(mu);
        worker->children.erase(key);
        return fail(pid.error().to_string());
      }
      {
        std::lock_guard lock(mu);
        if (auto it = worker->children.find(key); it != worker->children.end()) {
          it->second.pid = *pid;
        }
        if (auto* m = mesh_by_serial(serial)) m->pids.back() = *pid;
      }
      started.push_back(key);
      answer.args.push_back(key);
      answer.numbers.push_back(static_cast<uint64_t>(*pid));
    }
    done_spawning();
    worker_reply(to, std::move(answer));
  }

  // A child of this worker exited: its mesh records how (a later controller that finds the
  // mesh learns it), and the controller it belongs to is told, if this worker serves it.
  void worker_child_exited(const std::string& key, const host::ExitStatus& s) {
    std::optional<channel::Address> to;
    uint64_t host_mesh = 0, host_index = 0;
    {
      std::lock_guard lock(mu);
      worker->children.erase(key);
      std::string owner;
      for (auto it = worker->meshes.begin(); it != worker->meshes.end(); ++it) {
        auto k = std::find(it->keys.begin(), it->keys.end(), key);
        if (k == it->keys.end()) continue;
        it->exits[k - it->keys.begin()] = s.to_string();
        owner = it->controller;
        if (it->name.empty() && !it->spawning && it->all_exited()) worker->meshes.erase(it);
        break;
      }
      if (worker->controller && worker->controller_key == owner) {
        to = worker->controller;
        host_mesh = worker->host_mesh;
        host_index = worker->host_index;
      }
    }
    if (!to) return;  // its controller is gone; the mesh record keeps the news
    worker_reply(*to, actor::SystemHeader{"host_proc_exit",
                                         {key},
                                         {host_mesh, host_index, static_cast<uint64_t>(s.pid),
                                          s.signaled ? 1u : 0u,
                                          static_cast<uint64_t>(static_cast<uint32_t>(s.code))}});
  }

  // In a host agent, a child's stdout and stderr are the forwarding pipes.
  void add_output_fds(host::ChildSpec& spec) {
    if (!worker || worker->out_fd[0] < 0) return;
    spec.fds.push_back(host::PassFd{worker->out_fd[0], 1});
    spec.fds.push_back(host::PassFd{worker->out_fd[1], 2});
  }

  // Creates the forwarding pipes and starts reading them (host agent).
  Status start_output_forwarding() {
    for (int i = 0; i < 2; ++i) {
      int fds[2];
      if (::pipe2(fds, O_CLOEXEC) != 0) return std::unexpected(errno_error("pipe2", errno));
      worker->out_fd[i] = fds[1];
      worker->out_reader[i] = std::make_unique<asio::posix::stream_descriptor>(proc->io(), fds[0]);
      read_output(i);
    }
    return ok();
  }

  void read_output(int i) {
    worker->out_reader[i]->async_read_some(
        asio::buffer(worker->out_buf[i]), [this, i](std::error_code ec, size_t n) {
          if (ec) return;  // the runtime stops
          forward_output(i + 1, std::string(worker->out_buf[i].data(), n));
          read_output(i);
        });
  }

  // To the controller served now, or to this process's own fd when there is none.
  void forward_output(int fd, std::string data) {
    std::optional<channel::Address> to;
    {
      std::lock_guard lock(mu);
      to = worker->controller;
    }
    if (to) {
      worker_reply(*to, actor::SystemHeader{"host_output", {std::move(data)},
                                            {static_cast<uint64_t>(fd)}});
    } else {
      write_all(fd, data);
    }
  }

  static void write_all(int fd, std::string_view data) {
    while (!data.empty()) {
      ssize_t n = ::write(fd, data.data(), data.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      data.remove_prefix(static_cast<size_t>(n));
    }
  }

  // Serves no controller from now on. A worker that is not persistent kills every proc; so
  // does a persistent one told to `stop` them (the controller shut its hosts down).
  void worker_release(const std::string& why, bool stop = false) {
    std::vector<pid_t> pids;
    {
      std::lock_guard lock(mu);
      if (!worker->controller) return;
      if (worker->persistent && !stop) {
        spdlog::warn("podium worker: controller {} {}; keeping its {} procs for the next one "
                     "(persistent)",
                     worker->controller_key, why, worker->children.size());
        worker->controller.reset();
        worker->controller_key.clear();
        return;
      }
      spdlog::warn("podium worker: controller {} {}; killing its {} procs", worker->controller_key,
                   why, worker->children.size());
      for (auto& [key, child] : worker->children) {
        if (child.pid > 0) pids.push_back(child.pid);
      }
      worker->controller.reset();
      worker->controller_key.clear();
    }
    for (pid_t pid : pids) (void)kill_proc_group(pid, SIGKILL);
  }

  // "host_kill" [proc key] [signal].
  void on_host_kill(const actor::SystemHeader& h, const std::string& sender) {
    if (h.args.size() != 1 || h.numbers.size() != 1) return;
    pid_t pid = -1;
    {
      std::lock_guard lock(mu);
      if (!worker->controller || !sender.starts_with(worker->controller_key)) return;
      if (auto it = worker->children.find(h.args[0]); it != worker->children.end()) {
        pid = it->second.pid;
      }
    }
    if (pid > 0) (void)kill_proc_group(pid, static_cast<int>(h.numbers[0]));
  }

  // "host_lookup" [controller key, mesh name] [request id]: the controller served now takes
  // over the proc mesh of that name (HA-7). Answered by "host_found" [error, extent, then
  // key and exit ("" while alive) per proc] [request id, first rank, then one pid per proc].
  void on_host_lookup(const actor::SystemHeader& h) {
    if (h.args.size() != 2 || h.numbers.size() != 1) return;
    auto controller = channel::Address::parse(h.args[0]);
    if (!controller) return;
    actor::SystemHeader answer{"host_found", {""}, {h.numbers[0]}};
    std::string where = "host " + actor::host_name() + " (worker " + proc_key + ")";
    if (!from_controller(h.args[0])) {
      answer.args[0] = where + " does not serve this controller";
      return worker_reply(*controller, std::move(answer));
    }
    {
      std::lock_guard lock(mu);
      Worker::Mesh* found = nullptr;
      std::string names;
      for (auto& m : worker->meshes) {
        if (m.name.empty()) continue;
        if (m.name == h.args[1]) found = &m;
        names += (names.empty() ? "'" : ", '") + m.name + "'";
      }
      if (!found) {
        answer.args[0] = where + " keeps no proc mesh named '" + h.args[1] + "' (" +
                         (names.empty() ? std::string("it keeps no named proc mesh")
                                        : "it keeps " + names) +
                         ")";
      } else if (found->all_exited()) {
        answer.args[0] = where + " keeps proc mesh '" + h.args[1] + "' no more: its " +
                         std::to_string(found->keys.size()) + " procs have all ended (rank " +
                         std::to_string(found->first) + " " + found->exits.front() + ")";
      } else {
        found->controller = h.args[0];
        answer.args.push_back(found->extent);
        answer.numbers.push_back(found->first);
        for (size_t i = 0; i < found->keys.size(); ++i) {
          answer.args.push_back(found->keys[i]);
          answer.args.push_back(found->exits[i]);
          answer.numbers.push_back(static_cast<uint64_t>(found->pids[i]));
        }
      }
    }
    worker_reply(*controller, std::move(answer));
  }

  // "host_detach" [controller key] [request id, stop]: the controller leaves (stop 0: a
  // persistent worker keeps its procs), or shut this host down (stop 1: every proc ends).
  // Answered by "host_spawned" with no error and no procs once the procs were killed.
  void on_host_detach(const actor::SystemHeader& h) {
    if (h.args.size() != 1 || h.numbers.size() != 2) return;
    auto controller = channel::Address::parse(h.args[0]);
    if (!controller || !from_controller(h.args[0])) return;
    bool stop = h.numbers[1] != 0;
    worker_release(stop ? "shut this host down" : "detached", stop);
    worker_reply(*controller, actor::SystemHeader{"host_spawned", {""}, {h.numbers[0]}});
  }

  void worker_tick() {
    std::optional<channel::Address> to;
    actor::SystemHeader beat{"host_hb", {}, {}};
    bool lost = false;
    std::chrono::milliseconds lost_after{3000};
    {
      std::lock_guard lock(mu);
      if (shut_down) return;
      auto& w = *worker;
      lost_after = w.lost_after;
      if (w.controller) {
        if (std::chrono::steady_clock::now() - w.last_heard > w.lost_after) {
          lost = true;
        } else {
          to = w.controller;
          beat.numbers = {w.host_mesh, w.host_index};
        }
      }
    }
    if (lost) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "was not heard from for %.1f s", lost_after.count() / 1000.0);
      worker_release(buf);
    }
    if (to) worker_reply(*to, std::move(beat));
    std::lock_guard lock(mu);
    if (shut_down) return;
    worker->timer->expires_after(std::max(std::chrono::milliseconds(20), lost_after / 6));
    worker->timer->async_wait([this](std::error_code ec) {
      if (!ec) worker_tick();
    });
  }
};

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Runtime::~Runtime() { shutdown(); }

Runtime& Runtime::get() {
  // Every cast asks; the runtime is set once and lives until the process exits.
  Runtime* rt = g_current.load(std::memory_order_acquire);
  if (!rt) {
    spdlog::critical("podium: podium::init() must be called before using meshes");
    std::abort();
  }
  return *rt;
}

actor::Proc& Runtime::proc() { return *impl_->proc; }
const std::string& Runtime::proc_key() const { return impl_->proc_key; }
Supervisor& Runtime::supervisor() { return *impl_->supervisor; }
Relay& Runtime::relay() { return *impl_->relay; }

std::optional<Error> Runtime::proc_dead(const std::string& proc_key) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->dead.find(proc_key);
  if (it == impl_->dead.end()) return std::nullopt;
  return it->second;
}
void Runtime::kill_proc(const std::string& proc_key) { impl_->kill(proc_key); }
void Runtime::watch(const std::shared_ptr<ProcMeshState>& mesh) {
  std::lock_guard lock(impl_->mu);
  impl_->add_view(mesh);
}

Result<std::shared_ptr<ProcMeshState>> Runtime::spawn_procs(const ndslice::Extent& extent) {
  auto& impl = *impl_;
  if (impl.sock_dir.empty()) {
    return std::unexpected(make_error(BaseErrc::kUnsupported,
                                      "spawning procs from a spawned proc is not supported yet"));
  }
  auto mesh = std::make_shared<ProcMeshState>();
  mesh->extent = extent;
  mesh->initialized = mesh->initialized_promise.future();
  {
    std::lock_guard lock(impl.mu);
    if (impl.shut_down) {
      return std::unexpected(make_error(BaseErrc::kCancelled, "podium runtime is shut down"));
    }
    mesh->mesh_id = impl.next_mesh++;
    impl.meshes[mesh->mesh_id] = mesh;
  }
  size_t n = extent.num_ranks();
  mesh->procs.resize(n);
  // A job on TCP puts its local procs on TCP too: procs on other hosts must reach them.
  const auto& self = impl.proc->id().addr;
  bool tcp = self.transport == channel::Transport::kTcp;
  std::vector<channel::PortReservation> ports;
  for (size_t r = 0; r < n; ++r) {
    if (tcp) {
      auto port = channel::PortReservation::make(self.target);
      if (!port) return std::unexpected(port.error());
      mesh->procs[r].id = actor::ProcId{channel::Address{
          channel::Transport::kTcp, self.target, port->port(), channel::new_incarnation()}};
      ports.push_back(std::move(*port));
      continue;
    }
    std::string path = impl.sock_dir + "/m" + std::to_string(mesh->mesh_id) + "-" +
                       std::to_string(r) + ".sock";
    mesh->procs[r].id = actor::ProcId{channel::Address{channel::Transport::kUnix, path, 0}};
  }
  std::string exe = g_options.proc_argv.empty() ? self_exe() : g_options.proc_argv[0];
  std::string parent = impl.proc->id().to_string();
  auto zygote = impl.zygote_for_spawn();
  std::string cwd;
  if (zygote) {
    std::error_code ec;
    cwd = std::filesystem::current_path(ec).string();
  }
  for (size_t r = 0; r < n; ++r) {
    std::string key = mesh->procs[r].id.to_string();
    {
      std::lock_guard lock(impl.mu);
      impl.by_key[key] = Impl::ProcRef{mesh, r, nullptr, 0};
      if (tcp) impl.reservations.emplace(key, std::move(ports[r]));
    }
    host::ChildSpec spec;
    spec.path = exe;
    spec.argv = g_options.proc_argv.empty() ? std::vector<std::string>{exe} : g_options.proc_argv;
    spec.env.emplace_back(kBootEnv, parent + ";" + key + ";" + std::to_string(mesh->mesh_id) +
                                        ";" + std::to_string(r) + (tcp ? ";reuse_port" : ""));
    auto on_exit = [&impl, key](const host::ExitStatus& s) { impl.on_exit(key, s); };
    Result<pid_t> pid = std::unexpected(Error{});
    if (zygote) {
      pid = zygote->spawn(host::ZygoteChild{spec.argv, host::current_environment(spec.env), cwd},
                          on_exit);
    } else {
      pid = impl.on_spawner([&] { return impl.watcher->spawn(spec, on_exit); });
    }
    if (!pid) {
      Error e = pid.error();
      mesh->initialized_promise.set(std::unexpected(e));
      std::lock_guard lock(mesh->mu);
      mesh->procs[r].exit = "failed to start: " + e.to_string();
      return std::unexpected(e);
    }
    std::lock_guard lock(mesh->mu);
    mesh->procs[r].pid = *pid;
  }
  return mesh;
}

Result<std::shared_ptr<HostMeshState>> Runtime::attach(std::vector<channel::Address> workers) {
  auto& impl = *impl_;
  auto refuse = [](std::string why) {
    return std::unexpected(make_error(BaseErrc::kInvalidArgument, std::move(why)));
  };
  if (impl.proc->id().addr.transport != channel::Transport::kTcp) {
    return refuse("attaching workers needs TCP between procs: call enable_transport(\"tcp\") "
                  "before anything starts podium in this process (this process listens on " +
                  impl.proc_key + ")");
  }
  if (workers.empty()) return refuse("attach: no workers given");
  for (const auto& w : workers) {
    if (w.transport != channel::Transport::kTcp || w.port == 0) {
      return refuse("attach: worker address " + w.to_string() +
                    " is not tcp://HOST:PORT with a port");
    }
  }
  auto hm = std::make_shared<HostMeshState>();
  hm->initialized = hm->initialized_promise.future();
  hm->hosts.resize(workers.size());
  for (size_t i = 0; i < workers.size(); ++i) hm->hosts[i].worker = workers[i];
  {
    std::lock_guard lock(impl.mu);
    if (impl.shut_down) {
      return std::unexpected(make_error(BaseErrc::kCancelled, "podium runtime is shut down"));
    }
    for (size_t i = 0; i < workers.size(); ++i) {
      std::string key = workers[i].to_string();
      // A worker serves one host mesh of this controller at a time; one that mesh can no
      // longer use (lost, refused, shut down) can be attached anew.
      if (auto it = impl.by_worker.find(key); it != impl.by_worker.end()) {
        std::lock_guard hlock(it->second.mesh->mu);
        if (!it->second.mesh->hosts[it->second.index].failure) {
          return refuse("attach: worker " + key + " is attached already");
        }
      }
      for (size_t j = 0; j < i; ++j) {
        if (workers[j] == workers[i]) return refuse("attach: worker " + key + " is named twice");
      }
    }
    hm->id = impl.next_host_mesh++;
    impl.host_meshes[hm->id] = hm;
    for (size_t i = 0; i < workers.size(); ++i) {
      impl.by_worker[workers[i].to_string()] = Impl::HostRef{hm, i};
    }
    impl.heard[hm.get()].assign(workers.size(), std::chrono::steady_clock::now());
    if (!impl.host_timer) {
      impl.host_timer = std::make_unique<asio::steady_timer>(impl.proc->io());
      asio::post(impl.proc->io(), [raw = &impl] { raw->arm_host_timer(); });
    }
  }
  for (size_t i = 0; i < workers.size(); ++i) {
    impl.send_to_worker(workers[i],
                        actor::SystemHeader{"host_attach",
                                            {impl.proc_key, workers[i].target},
                                            {hm->id, i,
                                             static_cast<uint64_t>(impl.host_lost_after.count())}});
  }
  return hm;
}

namespace {

// "hosts=2,gpus=4": how a worker keeps a mesh's extent (HA-7).
std::string extent_text(const ndslice::Extent& extent) {
  std::string out;
  for (size_t i = 0; i < extent.labels().size(); ++i) {
    if (i) out += ',';
    out += extent.labels()[i] + "=" + std::to_string(extent.sizes()[i]);
  }
  return out;
}

Result<ndslice::Extent> extent_from_text(const std::string& text) {
  std::vector<std::string> labels;
  std::vector<size_t> sizes;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    size_t eq = item.rfind('=');
    if (eq == std::string::npos) return std::unexpected(runtime_error("bad extent '" + text + "'"));
    labels.push_back(item.substr(0, eq));
    try {
      sizes.push_back(std::stoull(item.substr(eq + 1)));
    } catch (const std::exception&) {
      return std::unexpected(runtime_error("bad extent '" + text + "'"));
    }
    start = end + 1;
  }
  return ndslice::Extent::make(std::move(labels), std::move(sizes));
}

}  // namespace

Result<std::shared_ptr<ProcMeshState>> Runtime::spawn_procs(
    const std::shared_ptr<HostMeshState>& hosts, const std::vector<size_t>& host_ranks,
    const ndslice::Extent& extent, const std::string& name) {
  auto& impl = *impl_;
  size_t n = extent.num_ranks();
  if (host_ranks.empty() || n % host_ranks.size() != 0) {
    return std::unexpected(make_error(BaseErrc::kInvalidArgument,
                                      "spawn_procs: " + std::to_string(n) + " procs do not divide "
                                      "among " + std::to_string(host_ranks.size()) + " hosts"));
  }
  for (size_t h : host_ranks) {
    if (h >= hosts->hosts.size()) {
      return std::unexpected(make_error(BaseErrc::kInvalidArgument,
                                        "spawn_procs: no host " + std::to_string(h)));
    }
  }
  size_t per_host = n / host_ranks.size();
  // The hosts must have attached: their agents spawn.
  if (auto ready = hosts->initialized.get(impl.attach_timeout + std::chrono::seconds(1)); !ready) {
    return std::unexpected(ready.error());
  }
  if (auto bad = unusable_host(*hosts, host_ranks, "spawn_procs")) return std::unexpected(*bad);
  auto mesh = std::make_shared<ProcMeshState>();
  mesh->extent = extent;
  mesh->initialized = mesh->initialized_promise.future();
  mesh->procs.resize(n);
  std::vector<actor::Future<Impl::Spawned>> answers;
  {
    std::lock_guard lock(impl.mu);
    if (impl.shut_down) {
      return std::unexpected(make_error(BaseErrc::kCancelled, "podium runtime is shut down"));
    }
    mesh->mesh_id = impl.next_mesh++;
    impl.meshes[mesh->mesh_id] = mesh;
    for (size_t i = 0; i < host_ranks.size(); ++i) {
      auto [req, answer] = impl.new_request();
      answers.push_back(std::move(answer));
      impl.send_to_worker(hosts->hosts[host_ranks[i]].worker,
                          actor::SystemHeader{"host_spawn",
                                              {impl.proc_key, name, extent_text(extent)},
                                              {req, mesh->mesh_id, i * per_host, per_host}});
    }
  }
  auto deadline = std::chrono::steady_clock::now() + impl.attach_timeout;
  for (size_t i = 0; i < host_ranks.size(); ++i) {
    size_t h = host_ranks[i];
    std::string name;
    {
      std::lock_guard lock(hosts->mu);
      name = hosts->hosts[h].hostname + " (" + hosts->hosts[h].worker.to_string() + ")";
    }
    auto left = std::max(std::chrono::nanoseconds(0), deadline - std::chrono::steady_clock::now());
    auto got = answers[i].get(left);
    Error why;
    if (!got) {
      why = got.error().code == static_cast<int>(actor::ActorErrc::kTimeout)
                ? runtime_error("host " + name + " did not answer the spawn in time")
                : got.error();
    } else if (got->keys.size() != per_host) {
      why = runtime_error("host " + name + " answered the spawn with " +
                          std::to_string(got->keys.size()) + " procs, not " +
                          std::to_string(per_host));
    }
    if (!why.message.empty()) {
      mesh->initialized_promise.set(std::unexpected(why));
      return std::unexpected(why);  // procs already started die with the controller's detach
    }
    std::lock_guard lock(impl.mu);
    std::lock_guard hlock(hosts->mu);
    std::lock_guard mlock(mesh->mu);
    if (const auto& failure = hosts->hosts[h].failure) {
      // Lost or shut down while it spawned: its worker kills what it started (HA-5, HA-8).
      why = runtime_error("spawn_procs: host " + name + " cannot be used: " + *failure);
      mesh->initialized_promise.set(std::unexpected(why));
      return std::unexpected(why);
    }
    for (size_t j = 0; j < per_host; ++j) {
      size_t r = i * per_host + j;
      auto addr = channel::Address::parse(got->keys[j]);
      if (!addr) return std::unexpected(addr.error());
      mesh->procs[r].id = actor::ProcId{*addr};
      mesh->procs[r].pid = static_cast<int>(got->pids[j]);
      mesh->procs[r].host = hosts->hosts[h].hostname;
      std::string key = mesh->procs[r].id.to_string();
      impl.by_key[key] = Impl::ProcRef{mesh, r, hosts, h};
      hosts->hosts[h].proc_keys.push_back(key);
    }
  }
  return mesh;
}

Result<std::shared_ptr<ProcMeshState>> Runtime::find_procs(
    const std::shared_ptr<HostMeshState>& hosts, const std::vector<size_t>& host_ranks,
    const std::string& name) {
  auto& impl = *impl_;
  auto invalid = [](std::string why) {
    return std::unexpected(make_error(BaseErrc::kInvalidArgument, std::move(why)));
  };
  if (name.empty()) return invalid("find_procs: a proc mesh is found by its name");
  if (host_ranks.empty()) return invalid("find_procs: no hosts to look on");
  for (size_t h : host_ranks) {
    if (h >= hosts->hosts.size()) return invalid("find_procs: no host " + std::to_string(h));
  }
  if (auto ready = hosts->initialized.get(impl.attach_timeout + std::chrono::seconds(1)); !ready) {
    return std::unexpected(ready.error());
  }
  if (auto bad = unusable_host(*hosts, host_ranks, "find_procs('" + name + "')")) {
    return std::unexpected(*bad);
  }
  std::vector<actor::Future<Impl::Spawned>> answers;
  {
    std::lock_guard lock(impl.mu);
    if (impl.shut_down) {
      return std::unexpected(make_error(BaseErrc::kCancelled, "podium runtime is shut down"));
    }
    for (size_t h : host_ranks) {
      auto [req, answer] = impl.new_request();
      answers.push_back(std::move(answer));
      impl.send_to_worker(hosts->hosts[h].worker,
                          actor::SystemHeader{"host_lookup", {impl.proc_key, name}, {req}});
    }
  }
  auto host_name_of = [&](size_t h) {
    std::lock_guard lock(hosts->mu);
    return hosts->hosts[h].hostname + " (" + hosts->hosts[h].worker.to_string() + ")";
  };
  // Every host's part of the mesh, checked to fit together: one extent, and ranks that cover
  // it once (the hosts may be given in any order: each part says where it starts).
  auto deadline = std::chrono::steady_clock::now() + impl.attach_timeout;
  std::vector<Impl::Spawned> parts;
  std::optional<ndslice::Extent> extent;
  std::vector<int> owner;  // rank -> index into host_ranks, -1: not kept by any
  for (size_t i = 0; i < host_ranks.size(); ++i) {
    auto left = std::max(std::chrono::nanoseconds(0), deadline - std::chrono::steady_clock::now());
    auto got = answers[i].get(left);
    if (!got) {
      if (got.error().code == static_cast<int>(actor::ActorErrc::kTimeout)) {
        return std::unexpected(make_error(BaseErrc::kTimeout,
                                          "host " + host_name_of(host_ranks[i]) +
                                              " did not answer the lookup of '" + name +
                                              "' in time"));
      }
      return invalid(got.error().message);
    }
    if (!extent) {
      auto e = extent_from_text(got->extent);
      if (!e) return std::unexpected(e.error());
      extent = std::move(*e);
      owner.assign(extent->num_ranks(), -1);
    } else if (got->extent != parts.front().extent) {
      return invalid(std::string(
          "the hosts disagree on proc mesh '" + name + "': host " +
          host_name_of(host_ranks[0]) + " keeps one of extent {" + parts.front().extent +
          "}, host " + host_name_of(host_ranks[i]) + " one of extent {" + got->extent + "}"));
    }
    for (size_t j = 0; j < got->keys.size(); ++j) {
      size_t r = got->first + j;
      if (r >= owner.size() || owner[r] != -1) {
        return invalid(std::string(
            "proc mesh '" + name + "': host " + host_name_of(host_ranks[i]) + " keeps rank " +
            std::to_string(r) + ", which " +
            (r >= owner.size() ? std::string("is outside its extent")
                               : "host " + host_name_of(host_ranks[owner[r]]) + " keeps too")));
      }
      owner[r] = static_cast<int>(i);
    }
    parts.push_back(std::move(*got));
  }
  if (auto gap = std::find(owner.begin(), owner.end(), -1); gap != owner.end()) {
    return invalid(std::string(
        "proc mesh '" + name + "' {" + parts.front().extent + "} has " +
        std::to_string(owner.size()) + " procs, but these hosts keep only some of them (rank " +
        std::to_string(gap - owner.begin()) + " is on none): attach to every host it was "
        "spawned on"));
  }
  {
    // Found before by this process: the same state, so that every handle sees its exits.
    std::lock_guard lock(impl.mu);
    auto it = impl.by_key.find(parts.front().keys.front());
    if (it != impl.by_key.end()) {
      auto known = it->second.mesh.lock();
      if (known && known->extent == *extent && it->second.rank == parts.front().first) {
        std::lock_guard mlock(known->mu);
        if (!known->procs[it->second.rank].exit) return known;
      }
    }
  }
  auto mesh = std::make_shared<ProcMeshState>();
  mesh->extent = *extent;
  mesh->initialized = mesh->initialized_promise.future();
  mesh->procs.resize(extent->num_ranks());
  std::optional<Error> first_dead;
  std::vector<channel::Address> alive;
  {
    std::lock_guard lock(impl.mu);
    if (impl.shut_down) {
      return std::unexpected(make_error(BaseErrc::kCancelled, "podium runtime is shut down"));
    }
    mesh->mesh_id = impl.next_mesh++;
    impl.meshes[mesh->mesh_id] = mesh;
    std::lock_guard hlock(hosts->mu);
    std::lock_guard mlock(mesh->mu);
    for (size_t i = 0; i < parts.size(); ++i) {
      size_t h = host_ranks[i];
      const auto& part = parts[i];
      for (size_t j = 0; j < part.keys.size(); ++j) {
        size_t r = part.first + j;
        auto addr = channel::Address::parse(part.keys[j]);
        if (!addr) return std::unexpected(addr.error());
        auto& p = mesh->procs[r];
        p.id = actor::ProcId{*addr};
        p.pid = static_cast<int>(part.pids[j]);
        p.host = hosts->hosts[h].hostname;
        std::string key = p.id.to_string();
        impl.by_key[key] = Impl::ProcRef{mesh, r, hosts, h};
        if (part.exits[j].empty()) {
          p.ready = true;
          ++mesh->ready_count;
          hosts->hosts[h].proc_keys.push_back(key);
          alive.push_back(*addr);
          continue;
        }
        // It ended while no controller served its host: calls to it fail at once (ME-2).
        p.exit = part.exits[j];
        std::string cause = "its proc (pid " + std::to_string(p.pid) + ") " +
                            (part.exits[j].starts_with("killed") ? "was " : "") + part.exits[j];
        impl.note_dead(key, runtime_error(cause), std::chrono::steady_clock::now());
        impl.arm_sweep();
        ++impl.dead_generation;
        if (!first_dead) {
          std::string who = "proc rank " + std::to_string(r);
          if (auto pt = mesh->extent.point_of_rank(r)) who += " " + pt->to_string();
          first_dead = runtime_error(who + " (pid " + std::to_string(p.pid) + ", " + key +
                                     ") of proc mesh '" + name + "' " + part.exits[j] +
                                     " before this controller attached");
        }
      }
    }
  }
  if (first_dead) {
    mesh->initialized_promise.set(std::unexpected(*first_dead));
  } else {
    mesh->initialized_promise.set({});
  }
  for (const auto& addr : alive) {
    impl.proc->send(addr, actor::system_message(actor::ProcId{addr},
                                                actor::SystemHeader{"adopt_procs",
                                                                    {impl.proc_key}, {}}));
  }
  return mesh;
}

std::shared_ptr<ProcMeshState> Runtime::this_proc() {
  std::lock_guard lock(impl_->mu);
  if (!impl_->local_mesh) {
    auto m = std::make_shared<ProcMeshState>();
    m->local = true;
    m->procs.push_back(ProcInfo{impl_->proc->id(), ::getpid(), true, std::nullopt});
    m->ready_count = 1;
    m->initialized = m->initialized_promise.future();
    m->initialized_promise.set({});
    impl_->local_mesh = std::move(m);
  }
  return impl_->local_mesh;
}

actor::Future<void> Runtime::shutdown_hosts(const std::shared_ptr<HostMeshState>& hosts,
                                            const std::vector<size_t>& host_ranks) {
  auto& impl = *impl_;
  struct Ending {
    std::string key;
    int64_t pid = -1;
    std::string host;
  };
  struct Shutdown {
    std::atomic<bool> finished{false};
    std::atomic<size_t> waiting{0};
    actor::Promise<void> done;
    std::vector<Ending> procs;                                     // immutable once sent
    std::vector<std::pair<std::string, actor::Future<Impl::Spawned>>> answers;  // by host
    std::vector<uint64_t> requests;
  };
  auto sd = std::make_shared<Shutdown>();
  auto future = sd->done.future();
  std::vector<std::pair<channel::Address, uint64_t>> detach;
  {
    std::lock_guard lock(impl.mu);
    std::lock_guard hlock(hosts->mu);
    for (size_t h : host_ranks) {
      if (h >= hosts->hosts.size()) continue;
      auto& host = hosts->hosts[h];
      std::string title = host_title(host);
      for (const auto& key : host.proc_keys) {
        if (impl.dead.contains(key)) continue;
        int64_t pid = -1;
        if (auto it = impl.by_key.find(key); it != impl.by_key.end()) {
          if (auto m = it->second.mesh.lock()) {
            std::lock_guard mlock(m->mu);
            pid = m->procs[it->second.rank].pid;
          }
        }
        impl.released.insert(key);
        sd->procs.push_back({key, pid, title});
      }
      if (host.failure) continue;  // refused, unreachable, lost or shut down: nothing to tell
      host.failure = "it was shut down";
      if (impl.shut_down) continue;  // detach_hosts() told it already
      auto [req, answer] = impl.new_request();
      sd->answers.emplace_back(title, std::move(answer));
      sd->requests.push_back(req);
      detach.emplace_back(host.worker, req);
    }
  }
  // Attaches still unanswered fail now; an attach that was answered keeps its value.
  hosts->initialized_promise.set(
      std::unexpected(make_error(BaseErrc::kCancelled, "the host mesh was shut down")));
  for (auto& [worker, req] : detach) {
    impl.send_to_worker(worker, actor::SystemHeader{"host_detach", {impl.proc_key}, {req, 1}});
  }
  auto* ip = &impl;
  auto timeout = impl.attach_timeout;
  // Once every worker answered (its procs are killed), or at the timeout: the procs end.
  auto finish = [sd, ip, timeout] {
    if (sd->finished.exchange(true)) return;
    for (const auto& [title, answer] : sd->answers) {
      if (!answer.ready()) {
        spdlog::warn("podium: host {} did not answer the shutdown within {} ms; its procs are "
                     "taken as ended",
                     title, timeout.count());
      }
    }
    {
      // Before the warnings, this would abandon the promises: every answer would be ready.
      std::lock_guard lock(ip->mu);
      for (uint64_t req : sd->requests) ip->spawn_requests.erase(req);
    }
    for (const auto& p : sd->procs) {
      ip->proc_ended(p.key, p.pid, 0, -1, "was stopped: its host " + p.host + " was shut down",
                     "its host " + p.host + " was shut down");
    }
    sd->done.set({});
  };
  if (sd->answers.empty()) {
    finish();
    return future;
  }
  sd->waiting = sd->answers.size();
  auto timer = std::make_shared<asio::steady_timer>(impl.proc->io(), timeout);
  timer->async_wait([timer, finish](std::error_code ec) {
    if (!ec) finish();
  });
  for (const auto& [title, answer] : sd->answers) {
    answer.on_ready([sd, finish](const Result<Impl::Spawned>&) {
      if (--sd->waiting == 0) finish();
    });
  }
  return future;
}

actor::Future<void> Runtime::stop_procs(const std::shared_ptr<ProcMeshState>& mesh,
                                        std::chrono::milliseconds grace) {
  struct Stopping {
    actor::Promise<void> done;
    std::shared_ptr<Collector> exits;  // kept alive until every proc has exited
  };
  auto stopping = std::make_shared<Stopping>();
  auto future = stopping->done.future();
  if (mesh->local) {
    stopping->done.set({});
    return future;
  }
  std::vector<std::pair<actor::ProcId, int>> alive;
  {
    std::lock_guard lock(mesh->mu);
    mesh->stopping = true;
    for (auto& p : mesh->procs) {
      if (!p.exit && p.pid > 0) alive.emplace_back(p.id, p.pid);
    }
  }
  if (alive.empty()) {
    stopping->done.set({});
    return future;
  }
  // The exit watcher fails every rank of a tracked collector when its proc exits, so a
  // collector over the live procs completes exactly when the last one is gone.
  std::vector<std::string> keys;
  for (auto& [id, pid] : alive) keys.push_back(id.to_string());
  auto exits = std::make_shared<Collector>(keys);
  stopping->exits = exits;
  exits->future().on_ready([stopping](const Result<Replies>&) {
    stopping->done.set({});
    stopping->exits.reset();
  });
  track(exits, keys);
  for (auto& [id, pid] : alive) {
    impl_->proc->send(id.addr, actor::system_message(id, actor::SystemHeader{"exit", {}, {}}));
  }
  // Escalate: whoever has not exited after the grace period is killed.
  auto timer = std::make_shared<asio::steady_timer>(impl_->proc->io(), grace);
  auto* impl = impl_.get();
  timer->async_wait([timer, alive, impl, exits](std::error_code ec) {
    if (ec || exits->future().ready()) return;
    for (auto& [id, pid] : alive) {
      if (impl->kill_any(id.to_string(), pid, SIGKILL)) {
        spdlog::warn("podium: proc {} (pid {}) did not exit within the grace period; killed",
                     id.to_string(), pid);
      }
    }
  });
  cancel_when_ready(timer, exits->future());
  return future;
}

void Runtime::track(const std::shared_ptr<Collector>& collector,
                    const std::vector<std::string>& proc_keys, std::atomic<uint64_t>* clean) {
  std::vector<std::pair<std::string, Error>> already;
  {
    std::lock_guard lock(impl_->mu);
    // Generations count from 1 here, so that 0 means "never checked".
    uint64_t gen = impl_->dead_generation + 1;
    if (!clean || clean->load(std::memory_order_relaxed) != gen) {
      for (const auto& k : proc_keys) {
        auto it = impl_->dead.find(k);
        if (it != impl_->dead.end()) already.emplace_back(k, it->second);
      }
      if (clean && already.empty()) clean->store(gen, std::memory_order_relaxed);
    }
    if (++impl_->tracks_since_prune >= 256) {
      impl_->collectors.remove_if([](const auto& w) { return w.expired(); });
      impl_->tracks_since_prune = 0;
    }
    impl_->collectors.push_back(collector);
  }
  for (auto& [k, e] : already) collector->proc_failed(k, e);
}

void Runtime::shutdown() {
  auto& impl = *impl_;
  {
    // ME-10: a second caller (the main thread on its way to exit() while the fault thread
    // ends the process) waits until the first has finished. Returning at once would let it
    // run the static destructors under a shutdown still joining threads (std::terminate).
    // Bounded, in case the first caller waits on this thread.
    std::unique_lock lock(impl.mu);
    if (impl.stopping) {
      if (!impl.stopped_cv.wait_for(lock, kShutdownWait, [&] { return impl.stopped; })) {
        spdlog::warn("podium: shutdown() waited {} s for another thread's shutdown; going on",
                     std::chrono::duration_cast<std::chrono::seconds>(kShutdownWait).count());
      }
      return;
    }
    impl.stopping = true;
  }
  impl.detach_hosts();  // while the loop still runs: the workers answer
  {
    std::lock_guard lock(impl.mu);
    impl.shut_down = true;
    if (impl.host_timer) impl.host_timer->cancel();
    if (impl.sweep_timer) impl.sweep_timer->cancel();
    if (impl.worker && impl.worker->timer) impl.worker->timer->cancel();
  }
  actor::Executor::set_drivable(nullptr);
  {
    std::shared_ptr<host::Zygote> zygote;
    {
      std::lock_guard lock(impl.spawn_mu);
      zygote = std::move(impl.zygote);
    }
    if (zygote) zygote->stop();  // SIGKILL to every forked proc's group (ME-3)
  }
  if (impl.watcher) impl.watcher->stop();  // SIGKILL to every proc group, reaped (ME-3)
  if (impl.proc) impl.proc->stop();
  {
    std::lock_guard lock(impl.spawn_mu);
    impl.spawner_stop = true;
  }
  impl.spawn_cv.notify_all();
  if (impl.spawner.joinable()) impl.spawner.join();
  if (!impl.sock_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(impl.sock_dir, ec);
  }
  {
    std::lock_guard lock(impl.mu);
    impl.stopped = true;
  }
  impl.stopped_cv.notify_all();
}

namespace {

// The root handler of a C++ program: an unhandled failure ends the controller with status 1,
// as Python's default unhandled_fault_hook does. exit() runs on a thread of its own, since
// atexit handlers stop the runtime whose thread delivered the failure.
void default_root_handler(actor::MeshFailure f) {
  spdlog::critical("podium: unhandled failure: {}", f.report());
  std::thread([] { std::exit(1); }).detach();
}

Result<std::unique_ptr<Runtime>> make_runtime(channel::Address listen, std::string sock_dir,
                                              std::optional<channel::Address> parent,
                                              bool reuse_port = false, bool worker = false,
                                              bool persistent = false) {
  base::init_logging();  // BL-1: log lines to stderr, the user's output alone on stdout
  auto impl = std::make_unique<Runtime::Impl>();
  impl->sock_dir = std::move(sock_dir);
  auto secret = internal::job_secret();
  if (!secret) return std::unexpected(secret.error());
  auto tls = internal::job_tls();
  if (!tls) return std::unexpected(tls.error());
  channel::Config net_config;
  net_config.secret = std::move(*secret);
  net_config.tls = std::move(*tls);
  net_config.reuse_port = reuse_port;
  // Peers may send "cast" (relay.h) as soon as this proc listens, before its handlers are
  // registered and before Runtime::get() works: those wait for serve_held_system_ops().
  auto proc = actor::Proc::make(actor::ProcConfig{std::move(listen), std::move(net_config), true});
  if (!proc) return std::unexpected(proc.error());
  impl->proc = std::move(*proc);
  impl->proc_key = impl->proc->id().to_string();
  // Threads of this process that wait for replies drive the root proc's loop themselves.
  actor::Executor::set_drivable(&impl->proc->executor());
  impl->watcher = std::make_unique<host::ChildWatcher>(impl->proc->io());
  impl->supervisor = std::make_unique<Supervisor>(*impl->proc);
  impl->supervisor->set_root_handler(g_fault_handler ? g_fault_handler
                                                     : Supervisor::RootHandler(&default_root_handler));
  impl->relay = std::make_unique<Relay>();
  impl->parent = std::move(parent);
  auto* raw = impl.get();
  impl->proc->on_system("cast", [raw](const actor::SystemHeader& h, wire::Envelope&& env) {
    raw->relay->on_cast(h, std::move(env));
  });
  impl->proc->on_system("ready", [raw](const actor::SystemHeader& h, wire::Envelope&&) {
    raw->on_ready(h);
  });
  impl->proc->on_system("proc_exit", [raw](const actor::SystemHeader& h, wire::Envelope&&) {
    raw->on_proc_exit(h);
  });
  impl->proc->on_system("actor_failed", [raw](const actor::SystemHeader& h, wire::Envelope&& env) {
    raw->on_actor_failed(h, std::move(env));
  });
  impl->proc->on_system("kill", [raw](const actor::SystemHeader& h, wire::Envelope&&) {
    raw->on_kill(h);
  });
  impl->proc->on_undeliverable([raw](const wire::Envelope& env, const Error& why) {
    raw->on_undeliverable(env, why);
  });
  auto env_ms = [](const char* name, std::chrono::milliseconds fallback) {
    const char* v = std::getenv(name);
    if (!v || !*v) return fallback;
    char* end = nullptr;
    long long ms = std::strtoll(v, &end, 10);
    if (*end || ms <= 0) {
      spdlog::warn("podium: ignoring {}={}: not a positive number of milliseconds", name, v);
      return fallback;
    }
    return std::chrono::milliseconds(ms);
  };
  impl->host_lost_after = env_ms("PODIUM_HOST_LOST_MS", impl->host_lost_after);
  impl->attach_timeout = env_ms("PODIUM_ATTACH_TIMEOUT_MS", impl->attach_timeout);
  // The controller side of attached hosts.
  impl->proc->on_system("host_attached", [raw](const actor::SystemHeader& h, wire::Envelope&&) {
    raw->on_host_attached(h);
  });
  impl->proc->on_system("host_spawned", [raw](const actor::SystemHeader& h, wire::Envelope&&) {
    raw->on_host_spawned(h);
  });
  impl->proc->on_system("host_proc_exit", [raw](const actor::SystemHeader& h, wire::Envelope&&) {
    raw->on_host_proc_exit(h);
  });
  impl->proc->on_system("host_found", [raw](const actor::SystemHeader& h, wire::Envelope&&) {
    raw->on_host_found(h);
  });
  // "adopt_procs" [controller]: a controller re-attached to this proc's persistent worker
  // took it over (HA-7); requests for the controller (kills) go there from now on.
  impl->proc->on_system("adopt_procs", [raw](const actor::SystemHeader& h, wire::Envelope&&) {
    if (h.args.size() != 1) return;
    auto addr = channel::Address::parse(h.args[0]);
    if (!addr) return;
    std::lock_guard lock(raw->mu);
    raw->parent = *addr;
  });
  // What procs on attached hosts print (their lines carry the actor's prefix already).
  impl->proc->on_system("host_output", [raw](const actor::SystemHeader& h, wire::Envelope&&) {
    if (raw->worker || h.args.size() != 1 || h.numbers.size() != 1) return;
    int fd = h.numbers[0] == 2 ? 2 : 1;
    Runtime::Impl::write_all(fd, h.args[0]);
  });
  impl->proc->on_system("host_hb", [raw](const actor::SystemHeader& h, wire::Envelope&&) {
    if (raw->worker) {
      if (!h.args.empty()) (void)raw->from_controller(h.args[0]);
    } else {
      size_t index = 0;
      (void)raw->host_of(h, &index);
    }
  });
  if (worker) {
    impl->worker = std::make_unique<Runtime::Impl::Worker>();
    impl->worker->timer = std::make_unique<asio::steady_timer>(impl->proc->io());
    impl->worker->persistent = persistent;
    impl->proc->on_system("host_attach", [raw](const actor::SystemHeader& h, wire::Envelope&&) {
      raw->on_host_attach(h);
    });
    impl->proc->on_system("host_spawn", [raw](const actor::SystemHeader& h, wire::Envelope&&) {
      raw->on_host_spawn(h);
    });
    impl->proc->on_system("host_kill", [raw](const actor::SystemHeader& h, wire::Envelope&& env) {
      raw->on_host_kill(h, env.sender);
    });
    impl->proc->on_system("host_detach", [raw](const actor::SystemHeader& h, wire::Envelope&&) {
      raw->on_host_detach(h);
    });
    impl->proc->on_system("host_lookup", [raw](const actor::SystemHeader& h, wire::Envelope&&) {
      raw->on_host_lookup(h);
    });
    if (auto st = raw->start_output_forwarding(); !st) return std::unexpected(st.error());
    asio::post(impl->proc->io(), [raw] { raw->worker_tick(); });
  }
  impl->spawner = std::thread(&Runtime::Impl::spawner_main, raw);
  return std::make_unique<Runtime>(std::move(impl));
}

}  // namespace
}  // namespace mesh

bool is_proc() { return std::getenv(mesh::kBootEnv) != nullptr; }

Status serve_proc() {
  const char* env = std::getenv(mesh::kBootEnv);
  if (!env) {
    return std::unexpected(make_error(BaseErrc::kInvalidArgument,
                                      std::string(mesh::kBootEnv) + " is not set: not a proc"));
  }
  // boot = "<parent proc addr>;<listen addr>;<mesh id>;<rank>"
  std::string boot = env;
  std::vector<std::string> f;
  size_t start = 0;
  for (size_t i = 0; i <= boot.size(); ++i) {
    if (i == boot.size() || boot[i] == ';') {
      f.push_back(boot.substr(start, i - start));
      start = i + 1;
    }
  }
  auto bad = [&](const std::string& why) {
    return std::unexpected(make_error(BaseErrc::kInvalidArgument,
                                      "bad " + std::string(mesh::kBootEnv) + "='" + boot +
                                          "': " + why));
  };
  if (f.size() != 4 && f.size() != 5) return bad("expected 4 or 5 fields");
  bool reuse_port = f.size() == 5 && f[4] == "reuse_port";
  auto parent = channel::Address::parse(f[0]);
  auto listen = channel::Address::parse(f[1]);
  if (!parent) return bad(parent.error().to_string());
  if (!listen) return bad(listen.error().to_string());
  uint64_t mesh_id = 0, rank = 0;
  try {
    mesh_id = std::stoull(f[2]);
    rank = std::stoull(f[3]);
  } catch (const std::exception&) {
    return bad("mesh id and rank must be numbers");
  }
  ::unsetenv(mesh::kBootEnv);  // actors that start programs must not make them procs
  {
    std::lock_guard lock(mesh::g_mu);
    if (mesh::g_runtime) return bad("the runtime is already running");
    auto rt = mesh::make_runtime(*listen, "", *parent, reuse_port);
    if (!rt) return std::unexpected(rt.error());
    mesh::g_runtime = std::move(*rt);
    mesh::g_current.store(mesh::g_runtime.get(), std::memory_order_release);
  }
  actor::Proc& proc = mesh::g_runtime->proc();
  proc.serve_held_system_ops();
  proc.send(*parent, actor::system_message(
                         actor::ProcId{*parent},
                         actor::SystemHeader{"ready", {f[1]},
                                             {mesh_id, rank, static_cast<uint64_t>(::getpid())}}));
  // The controller's "exit" ends the loop; its death ends the process (PR_SET_PDEATHSIG).
  proc.wait_exit_requested(std::chrono::hours(24 * 365 * 100));
  mesh::g_runtime->shutdown();
  return ok();
}

Status init_controller(InitOptions options) {
  std::lock_guard lock(mesh::g_mu);
  if (mesh::g_runtime) return ok();
  mesh::g_options = std::move(options);
  auto dir = mesh::make_socket_dir();
  if (!dir) return std::unexpected(dir.error());
  if (auto made = mesh::internal::ensure_controller_secret(*dir); !made) {
    std::error_code ec;
    std::filesystem::remove_all(*dir, ec);
    return std::unexpected(made.error());
  }
  channel::Address listen{channel::Transport::kUnix, *dir + "/controller.sock", 0};
  if (mesh::g_options.listen) listen = *mesh::g_options.listen;
  bool tcp = listen.transport == channel::Transport::kTcp;
  auto rt = mesh::make_runtime(std::move(listen), *dir, std::nullopt);
  if (!rt) return std::unexpected(rt.error());
  mesh::g_runtime = std::move(*rt);
  mesh::g_current.store(mesh::g_runtime.get(), std::memory_order_release);
  if (auto secret = mesh::internal::job_secret(); tcp && secret && secret->empty()) {
    // PODIUM_INSECURE=1 (SE-1 made no secret): say so, as an insecure worker does (SE-2).
    std::fprintf(stderr,
                 "podium: WARNING: PODIUM_INSECURE=1: this controller and its procs accept "
                 "unauthenticated TCP connections on %s; anyone who can reach them can run "
                 "code here\n",
                 mesh::g_runtime->proc().id().addr.to_string().c_str());
    std::fflush(stderr);
  }
  mesh::g_runtime->proc().serve_held_system_ops();
  std::atexit(shutdown);
  return ok();
}

std::string default_host_address() {
  if (const char* a = std::getenv("PODIUM_HOST_ADDR"); a && *a) return a;
  // The source address of the route to a public address: connect() on a UDP socket sends
  // nothing.
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(9);
    ::inet_pton(AF_INET, "192.0.2.1", &to.sin_addr);  // TEST-NET-1: never answered
    sockaddr_in me{};
    socklen_t len = sizeof me;
    char buf[INET_ADDRSTRLEN] = {};
    bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0 &&
              ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0 &&
              me.sin_addr.s_addr != 0 && ::inet_ntop(AF_INET, &me.sin_addr, buf, sizeof buf);
    ::close(fd);
    if (ok) return buf;
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (::getaddrinfo(actor::host_name().c_str(), nullptr, &hints, &res) == 0 && res) {
    char buf[INET_ADDRSTRLEN] = {};
    auto* in = reinterpret_cast<sockaddr_in*>(res->ai_addr);
    bool ok = ::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf) != nullptr;
    ::freeaddrinfo(res);
    if (ok) return buf;
  }
  return "127.0.0.1";
}

Status serve_worker(WorkerOptions options) {
  auto bad = [](std::string why) {
    return std::unexpected(make_error(BaseErrc::kInvalidArgument, std::move(why)));
  };
  if (options.listen.transport != channel::Transport::kTcp) {
    return bad("a worker listens on TCP (tcp://HOST:PORT), not " + options.listen.to_string());
  }
  // SE-2: a worker accepts controllers from other machines; it does so unauthenticated only
  // when told to.
  auto secret = mesh::internal::job_secret();
  if (!secret) return std::unexpected(secret.error());
  if (secret->empty()) {
    if (!options.insecure) {
      return bad("refusing to listen on " + options.listen.to_string() +
                 " without the job's secret: set PODIUM_SECRET_FILE (a file of mode 0600 holding "
                 "the secret; PODIUM_SECRET also works), or pass --insecure to accept "
                 "unauthenticated connections (anyone who can reach this port can then run code "
                 "in this worker's procs)");
    }
  }
  {
    std::lock_guard lock(mesh::g_mu);
    if (mesh::g_runtime) return bad("the podium runtime already runs in this process");
    mesh::g_options = std::move(options.procs);
    auto rt = mesh::make_runtime(options.listen, "", std::nullopt, false, true, options.persistent);
    if (!rt) return std::unexpected(rt.error());
    mesh::g_runtime = std::move(*rt);
    mesh::g_current.store(mesh::g_runtime.get(), std::memory_order_release);
  }
  auto& rt = *mesh::g_runtime;
  if (secret->empty()) {
    std::fprintf(stderr,
                 "podium worker: WARNING: --insecure: %s accepts unauthenticated connections; "
                 "anyone who can reach it can run code here\n",
                 rt.proc().id().addr.to_string().c_str());
    std::fflush(stderr);
  }
  rt.proc().serve_held_system_ops();
  spdlog::debug("podium worker: listening on {} (host {})", rt.proc_key(), actor::host_name());
  if (options.on_listening) options.on_listening(rt.proc().id().addr);
  rt.proc().wait_exit_requested(std::chrono::hours(24 * 365 * 100));
  mesh::g_runtime->shutdown();
  return ok();
}

void init(int argc, char** argv) {
  if (is_proc()) {
    auto st = serve_proc();
    if (!st) spdlog::critical("podium proc: {}", st.error().to_string());
    std::fflush(nullptr);
    ::_exit(st ? 0 : 2);
  }
  auto st = init_controller(InitOptions{std::vector<std::string>(argv, argv + argc)});
  if (!st) {
    spdlog::critical("podium: cannot start the runtime: {}", st.error().to_string());
    std::abort();
  }
  // argv[0] may be relative to a directory the procs do not start in: use the binary itself.
  if (!mesh::g_options.proc_argv.empty()) mesh::g_options.proc_argv[0] = mesh::self_exe();
}

void set_unhandled_fault_handler(std::function<void(actor::MeshFailure)> handler) {
  std::lock_guard lock(mesh::g_mu);
  mesh::g_fault_handler = handler;
  if (mesh::g_runtime) {
    mesh::g_runtime->supervisor().set_root_handler(
        handler ? std::move(handler) : mesh::Supervisor::RootHandler(&mesh::default_root_handler));
  }
}

void shutdown() {
  mesh::Runtime* rt = nullptr;
  {
    std::lock_guard lock(mesh::g_mu);
    rt = mesh::g_runtime.get();
  }
  // The runtime object lives until the process exits; only its services stop here.
  if (rt) rt->shutdown();
}

}  // namespace podium
