#include "podium/mesh/runtime.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <list>
#include <random>
#include <thread>
#include <unordered_map>

#include "podium/actor/executor.h"
#include "podium/actor/message.h"
#include "podium/host/child_watcher.h"
#include "podium/host/zygote.h"
#include "podium/mesh/cast.h"
#include "podium/mesh/relay.h"
#include "podium/mesh/supervisor.h"

namespace podium {
namespace mesh {
namespace {

constexpr const char* kBootEnv = "PODIUM_BOOT";

std::mutex g_mu;                     // guards g_runtime
std::unique_ptr<Runtime> g_runtime;  // set by init()
std::atomic<Runtime*> g_current{nullptr};  // g_runtime.get(), read without the lock
InitOptions g_options;  // set once by init()/init_controller(), before any spawn
std::function<void(actor::MeshFailure)> g_fault_handler;  // guarded by g_mu; empty: default

Error runtime_error(std::string msg) {
  return make_error(actor::ActorErrc::kProcExited, std::move(msg));
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

struct Runtime::Impl {
  std::unique_ptr<actor::Proc> proc;
  std::unique_ptr<host::ChildWatcher> watcher;
  std::unique_ptr<Supervisor> supervisor;
  std::unique_ptr<Relay> relay;
  std::optional<channel::Address> parent;  // the controller, in a proc; immutable
  // The zygote procs fork from (InitOptions::zygote_argv), started by the first spawn;
  // guarded by spawn_mu. zygote_failed: it could not start, procs are exec'd.
  std::shared_ptr<host::Zygote> zygote;
  bool zygote_failed = false;
  std::string sock_dir;  // empty in workers
  std::string proc_key;  // proc->id().to_string(), immutable after make_runtime()

  std::mutex mu;  // guards everything below
  uint64_t next_mesh = 1;
  std::unordered_map<uint64_t, std::weak_ptr<ProcMeshState>> meshes;
  struct ProcRef {
    std::weak_ptr<ProcMeshState> mesh;
    size_t rank;
  };
  std::unordered_map<std::string, ProcRef> by_key;   // proc addr text -> mesh, rank
  std::unordered_map<std::string, Error> dead;       // proc addr text -> why
  std::list<std::weak_ptr<Collector>> collectors;
  size_t tracks_since_prune = 0;
  std::shared_ptr<ProcMeshState> local_mesh;
  bool shut_down = false;

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
      std::lock_guard lock(mu);
      if (dead.contains(key) || shut_down) {
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
    std::shared_ptr<ProcMeshState> mesh;
    size_t rank = 0;
    std::string who;
    std::vector<channel::Address> others;
    bool down = false;
    {
      std::lock_guard lock(mu);
      down = shut_down;
      auto it = by_key.find(key);
      if (it != by_key.end()) {
        mesh = it->second.mesh.lock();
        rank = it->second.rank;
      }
      who = "proc " + key + " (pid " + std::to_string(status.pid) + ")";
      if (mesh) {
        who = "proc rank " + std::to_string(rank);
        if (auto p = mesh->extent.point_of_rank(rank)) who += " " + p->to_string();
        who += " (pid " + std::to_string(status.pid) + ", " + key + ")";
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
    bool expected = down;
    if (mesh) {
      std::lock_guard lock(mesh->mu);
      mesh->procs[rank].exit = status.to_string();
      expected = expected || mesh->stopping;
    }
    if (!expected) spdlog::warn("podium: {} {}", who, status.to_string());
    if (mesh) {
      mesh->initialized_promise.set(std::unexpected(runtime_error(who + " " + status.to_string())));
    }
    std::string cause = exit_cause(status);
    int32_t sig = status.signaled ? status.code : 0;
    int32_t code = status.signaled ? -1 : status.code;
    if (!down) {
      for (const auto& addr : others) {
        proc->send(addr, actor::system_message(
                             actor::ProcId{addr},
                             actor::SystemHeader{
                                 "proc_exit",
                                 {key, cause},
                                 {static_cast<uint64_t>(status.pid), expected ? 1u : 0u,
                                  static_cast<uint64_t>(static_cast<uint32_t>(sig)),
                                  static_cast<uint64_t>(static_cast<uint32_t>(code))}}));
      }
    }
    proc_gone(key, status.pid, sig, code, cause, expected);
  }

  // A proc ended (seen here, or told by the controller): calls waiting on it fail (ME-2), and
  // unless it was being stopped, the meshes owned here with an actor on it failed (SV-2).
  void proc_gone(const std::string& key, int64_t pid, int32_t sig, int32_t code,
                 const std::string& cause, bool expected) {
    std::vector<std::shared_ptr<Collector>> waiting;
    Error why = runtime_error(cause);
    {
      std::lock_guard lock(mu);
      if (dead.contains(key)) return;
      dead[key] = why;
      for (auto& w : collectors) {
        if (auto c = w.lock()) waiting.push_back(std::move(c));
      }
    }
    // The owner hears first: a caller that sees its call fail and ends the program finds the
    // fault queued already (the unhandled fault hook still runs at exit).
    if (!expected) supervisor->proc_exited(key, pid, sig, code, cause);
    for (auto& c : waiting) c->proc_failed(key, why);
    relay->proc_gone(key, why);  // CT-4: casts that route through it go around it
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
      std::lock_guard lock(mu);
      if (dead.contains(key)) return;
      auto it = by_key.find(key);
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
  for (size_t r = 0; r < n; ++r) {
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
      impl.by_key[key] = Impl::ProcRef{mesh, r};
    }
    host::ChildSpec spec;
    spec.path = exe;
    spec.argv = g_options.proc_argv.empty() ? std::vector<std::string>{exe} : g_options.proc_argv;
    spec.env.emplace_back(kBootEnv, parent + ";" + key + ";" + std::to_string(mesh->mesh_id) +
                                        ";" + std::to_string(r));
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
      if (impl->kill_proc_group(pid, SIGKILL)) {
        spdlog::warn("podium: proc {} (pid {}) did not exit within the grace period; killed",
                     id.to_string(), pid);
      }
    }
  });
  return future;
}

void Runtime::track(const std::shared_ptr<Collector>& collector,
                    const std::vector<std::string>& proc_keys) {
  std::vector<std::pair<std::string, Error>> already;
  {
    std::lock_guard lock(impl_->mu);
    for (const auto& k : proc_keys) {
      auto it = impl_->dead.find(k);
      if (it != impl_->dead.end()) already.emplace_back(k, it->second);
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
    std::lock_guard lock(impl.mu);
    if (impl.shut_down) return;
    impl.shut_down = true;
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
}

namespace {

// The root handler of a C++ program: an unhandled failure ends the controller with status 1,
// as Python's default unhandled_fault_hook does. exit() runs on a thread of its own, since
// atexit handlers stop the runtime whose thread delivered the failure.
void default_root_handler(actor::MeshFailure f) {
  spdlog::critical("podium: unhandled failure: {}", f.report());
  std::thread([] { std::exit(1); }).detach();
}

// The job's shared secret (channel CH-8): PODIUM_SECRET, or the contents of the file
// PODIUM_SECRET_FILE names (a trailing newline dropped). Empty when neither is set.
Result<std::string> job_secret() {
  if (const char* s = std::getenv("PODIUM_SECRET"); s && *s) return std::string(s);
  const char* path = std::getenv("PODIUM_SECRET_FILE");
  if (!path || !*path) return std::string();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return std::unexpected(make_error(BaseErrc::kIo, std::string("PODIUM_SECRET_FILE ") + path +
                                                         ": cannot read it"));
  }
  std::string secret((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) {
    return std::unexpected(make_error(BaseErrc::kInvalidArgument,
                                      std::string("PODIUM_SECRET_FILE ") + path + " is empty"));
  }
  return secret;
}

Result<std::unique_ptr<Runtime>> make_runtime(channel::Address listen, std::string sock_dir,
                                              std::optional<channel::Address> parent) {
  auto impl = std::make_unique<Runtime::Impl>();
  impl->sock_dir = std::move(sock_dir);
  auto secret = job_secret();
  if (!secret) return std::unexpected(secret.error());
  channel::Config net_config;
  net_config.secret = std::move(*secret);
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
  if (f.size() != 4) return bad("expected 4 fields");
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
    auto rt = mesh::make_runtime(*listen, "", *parent);
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
  auto rt = mesh::make_runtime(
      channel::Address{channel::Transport::kUnix, *dir + "/controller.sock", 0}, *dir,
      std::nullopt);
  if (!rt) return std::unexpected(rt.error());
  mesh::g_runtime = std::move(*rt);
  mesh::g_current.store(mesh::g_runtime.get(), std::memory_order_release);
  mesh::g_runtime->proc().serve_held_system_ops();
  std::atexit(shutdown);
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
