// Runtime::Impl's proc table (runtime_impl.h): the procs this process spawned or heard of,
// their readiness (ME-4), ends (ME-2, ME-7), kills and stops (ME-8), and the sweep of their
// dead records (ME-11). Local spawns (Runtime::spawn_procs(extent)) live here too.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "podium/actor/message.h"
#include "podium/host/death_watch.h"
#include "podium/mesh/bootstrap.h"
#include "podium/mesh/grace_timer.h"
#include "podium/mesh/host_protocol.h"
#include "podium/mesh/runtime_impl.h"

namespace podium::mesh {

namespace {

// "its proc (pid 42) was killed by signal SIGKILL (9)": the cause a caller sees.
std::string exit_cause(const host::ExitStatus& status) {
  return "its proc (pid " + std::to_string(status.pid) + ") " + (status.signaled ? "was " : "") +
         status.to_string();
}

Error proc_exited(std::string msg) {
  return make_error(actor::ActorErrc::kProcExited, std::move(msg));
}

// ME-15: why the proc (pid `pid`) that descends from `spawner` (pid `spawner_pid`; `direct`:
// spawned by it) counts as ended: "its proc (pid 7) ended with the proc that spawned it (pid
// 5, unix:...), which was killed by signal SIGKILL (9)". `spawner_cause` is the spawner's
// own ("its proc (pid 5) was ...").
std::string orphan_cause(int64_t pid, bool direct, const std::string& spawner,
                         int64_t spawner_pid, const std::string& spawner_cause) {
  std::string how = spawner_cause;
  std::string prefix = "its proc (pid " + std::to_string(spawner_pid) + ") ";
  if (how.starts_with(prefix)) {
    how.erase(0, prefix.size());
  } else {
    how = "ended: " + how;
  }
  return "its proc (pid " + std::to_string(pid) + ") ended with " +
         (direct ? "the proc that spawned it" : "a proc it descends from") + " (pid " +
         std::to_string(spawner_pid) + ", " + spawner + "), which " + how;
}

}  // namespace

Error Runtime::Impl::shut_down_error() const {
  return make_error(MeshErrc::kShutDown, "podium runtime is shut down");
}

void Runtime::Impl::malformed(const std::string& op, const std::string& sender, const Error& why) {
  bad_messages.warn("podium: ignored a malformed {} from {}: {}", op,
                    sender.empty() ? std::string("an unnamed sender") : sender, why.message);
}

void Runtime::Impl::on_ready(const actor::SystemHeader& h, const std::string& sender) {
  auto m = proto::Ready::decode(h);
  if (!m) return malformed(h.op, sender, m.error());
  std::shared_ptr<ProcMeshState> mesh;
  {
    std::lock_guard lock(mu);
    auto it = meshes.find(m->proc_mesh);
    if (it != meshes.end()) mesh = it->second.lock();
  }
  // A mesh is published (meshes) only once its procs are filled in: procs.size() is final.
  if (!mesh) {
    spdlog::debug("podium: ready from {} for proc mesh {}, which is gone", sender, m->proc_mesh);
    return;
  }
  if (m->rank >= mesh->procs.size()) {
    return malformed(h.op, sender,
                     make_error(MeshErrc::kProtocol, "rank " + std::to_string(m->rank) +
                                                         " is outside proc mesh " +
                                                         std::to_string(m->proc_mesh)));
  }
  bool all = false;
  {
    std::lock_guard lock(mesh->mu);
    auto& p = mesh->procs[m->rank];
    if (p.ready || p.exit) return;
    p.ready = true;
    all = ++mesh->ready_count == mesh->procs.size();
  }
  if (all) mesh->initialized_promise.set({});
}

// One-way messages that could not be delivered. Those to procs that have exited or are
// being stopped are expected (an "exit" that the proc obeyed before acknowledging it).
void Runtime::Impl::on_undeliverable(const wire::Envelope& env, const Error& why) {
  bool expected = false;
  if (auto v = actor::split_port_id(env.dest)) {
    std::string key(v->addr);
    if (worker_undeliverable(key, why)) {
      spdlog::debug("podium: undeliverable to worker {}: {}", key, why.to_string());
      return;
    }
    if (agent && agent->expects_undeliverable(key)) {
      expected = true;  // a worker's answer to a controller it no longer serves
    } else {
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
  }
  if (expected) {
    spdlog::debug("podium: undeliverable to a stopped proc: {}: {}", env.dest, why.to_string());
  } else {
    spdlog::warn("podium: undeliverable message from {} to {}: {}", env.sender, env.dest,
                 why.to_string());
  }
}

void Runtime::Impl::on_exit(const std::string& key, const host::ExitStatus& status) {
  {
    std::lock_guard lock(mu);
    reservations.erase(key);  // its port is free only now
    if (ended_early.erase(key) > 0) return;  // on_dying told already, with this status
  }
  proc_ended(key, status.pid, status.signaled ? status.code : 0, status.signaled ? -1 : status.code,
             status.to_string(), exit_cause(status));
}

// DW-1: the exit of the proc `key` has begun (its memory is still being torn down): its end,
// with the status the reap will give, 10 to 30 ms sooner for a proc with torch loaded. A proc
// being stopped, released or shut down is left to its reap, as before. DW-3: a death nobody
// asked for is torn down at nice 19 from here on, so that the live procs keep the CPU.
void Runtime::Impl::on_dying(const std::string& key, const host::ExitStatus& status) {
  static const bool lower = [] {
    const char* v = std::getenv("PODIUM_DYING_NICE");
    return v == nullptr || std::string(v) != "0";
  }();
  bool reaped = false;
  {
    std::lock_guard lock(mu);
    if (shut_down || released.contains(key)) return;
    auto it = by_key.find(key);
    if (it == by_key.end()) return;
    if (auto mesh = it->second.mesh.lock()) {
      std::lock_guard mlock(mesh->mu);
      if (mesh->stopping) return;
    }
    if (!ended_early.insert(key).second) return;
    // Not once reaped: the pid may name another process by then.
    reaped = dead.contains(key);
  }
  if (lower && !reaped) host::DeathWatch::lower_dying(static_cast<pid_t>(status.pid));
  proc_ended(key, status.pid, status.signaled ? status.code : 0, status.signaled ? -1 : status.code,
             status.to_string(), exit_cause(status));
}

// The proc `key` is gone: it exited (`how`: "exited with status 3") or its host was lost.
// `cause` is what callers see ("its proc (pid 42) was killed by signal SIGKILL (9)").
void Runtime::Impl::proc_ended(const std::string& key, int64_t pid, int32_t sig, int32_t code,
                               const std::string& how, const std::string& cause_seen) {
  std::shared_ptr<ProcMeshState> mesh;
  size_t rank = 0;
  std::string who;
  std::vector<channel::Address> others;
  bool down = false;
  bool was_released = false;
  std::string cause = cause_seen;
  {
    std::lock_guard lock(mu);
    down = shut_down;
    was_released = released.erase(key) > 0;
    if (auto it = end_reasons.find(key); it != end_reasons.end()) {  // ME-15
      cause = std::move(it->second);
      end_reasons.erase(it);
    }
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
    others = exit_listeners(key, nullptr);  // ME-7, ME-14
  }
  bool expected = down || was_released;
  if (mesh) {
    std::lock_guard lock(mesh->mu);
    if (mesh->procs[rank].exit) return;  // told twice (its host lost, then its exit)
    mesh->procs[rank].exit = how;
    expected = expected || mesh->stopping;
  }
  if (!expected) spdlog::warn("podium: {} {}", who, how);
  if (mesh) mesh->initialized_promise.set(std::unexpected(proc_exited(who + " " + how)));
  if (!down) {
    auto note = proto::ProcExit{key, cause, pid, expected, sig, code}.encode();
    for (const auto& addr : others) send_to(addr, note);
  }
  // Calls still waiting when this process shuts down (its exit, with a failure being
  // reported on another thread) fail with the reason their procs went.
  proc_gone(key, pid, sig, code, down ? cause + " when this process shut down" : cause, expected);
}

// ME-7, ME-14: who hears of the end of the proc `key` from here: every other live proc this
// process spawned (or adopted) and the process that spawned this one, but `from` (the one
// that told us). mu held.
std::vector<channel::Address> Runtime::Impl::exit_listeners(const std::string& key,
                                                            const channel::Address* from) {
  std::vector<channel::Address> out;
  std::string skip = from ? from->to_string() : std::string();
  for (const auto& [k, ref] : by_key) {
    if (k == key || k == skip || dead.contains(k)) continue;
    auto m = ref.mesh.lock();
    if (!m) continue;
    std::lock_guard mlock(m->mu);
    const auto& p = m->procs[ref.rank];
    if (!p.exit && p.pid > 0) out.push_back(p.id.addr);
  }
  if (parent) {
    std::string up = parent->to_string();
    if (up != skip && up != key) out.push_back(*parent);
  }
  return out;
}

// A proc ended (seen here, or told by the controller): calls waiting on it fail (ME-2), and
// unless it was being stopped, the meshes owned here with an actor on it failed (SV-2).
// False when this process knew of that end already.
bool Runtime::Impl::proc_gone(const std::string& key, int64_t pid, int32_t sig, int32_t code,
                              const std::string& cause, bool expected) {
  std::vector<std::shared_ptr<Collector>> waiting;
  std::vector<std::shared_ptr<ProcMeshState>> views, tied;
  Error why = proc_exited(cause);
  {
    std::lock_guard lock(mu);
    if (!note_dead(key, why, now())) return false;
    ++dead_generation;
    arm_sweep();
    for (auto& w : collectors) {
      if (auto c = w.lock()) waiting.push_back(std::move(c));
    }
    if (!shut_down) {  // ME-15
      views = views_spawned_by(key);
      if (auto it = spawned_for.find(key); it != spawned_for.end()) {
        tied = std::move(it->second);
        spawned_for.erase(it);
      }
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
  if (!views.empty() || !tied.empty()) {
    end_descendants(key, pid, cause, expected, std::move(views), std::move(tied));
  }
  return true;
}

// ME-15: the proc `key` ended. The procs of the views spawned by it (or for it) end with
// it: each counts as ended here at once (PR_SET_PDEATHSIG kills a local spawner's procs; a
// controller kills those it spawned for it), unless this process watches it itself (it
// sees that end) or it is this process. Then the meshes this controller spawned for it.
void Runtime::Impl::end_descendants(const std::string& key, int64_t pid, const std::string& cause,
                                    bool expected,
                                    std::vector<std::shared_ptr<ProcMeshState>> views,
                                    std::vector<std::shared_ptr<ProcMeshState>> tied) {
  struct Ended {
    std::string key;
    int64_t pid;
    bool direct;
  };
  std::vector<Ended> ended;
  for (const auto& v : views) {
    std::lock_guard lock(v->mu);
    bool direct = !v->spawners.empty() && v->spawners.front() == key;
    for (const auto& p : v->procs) ended.push_back(Ended{p.id.to_string(), p.pid, direct});
  }
  for (const auto& e : ended) {
    {
      std::lock_guard lock(mu);
      if (e.key == proc_key || by_key.contains(e.key) || dead.contains(e.key)) continue;
    }
    proc_gone(e.key, e.pid, SIGKILL, -1, orphan_cause(e.pid, e.direct, key, pid, cause),
              expected);
  }
  if (!tied.empty()) end_spawned_for(key, pid, cause, std::move(tied), expected);
}

// ME-15: the proc `key`, for which this controller spawned the meshes `tied` on attached
// hosts, ended: stopped, they stop ("exit", SIGKILL after a grace period); failed, they are
// killed at once, as PR_SET_PDEATHSIG kills a local spawner's procs. Either way their ends
// are expected (no warning each; their holders heard of `key`'s end already), and their
// cause names `key` (end_reasons), as a view's would (end_descendants).
void Runtime::Impl::end_spawned_for(const std::string& key, int64_t pid, const std::string& cause,
                                    std::vector<std::shared_ptr<ProcMeshState>> tied,
                                    bool expected) {
  constexpr std::chrono::milliseconds kGrace{5000};  // as ProcMesh.stop()'s (Python)
  for (auto& mesh : tied) {
    std::vector<std::pair<std::string, std::string>> reasons;
    {
      // Tied to several procs of one line (spawned_for): the first end ends it.
      std::lock_guard lock(mesh->mu);
      if (mesh->stopping) continue;
      bool direct = !mesh->spawners.empty() && mesh->spawners.front() == key;
      for (const auto& p : mesh->procs) {
        if (!p.exit) {
          reasons.emplace_back(p.id.to_string(), orphan_cause(p.pid, direct, key, pid, cause));
        }
      }
    }
    {
      std::lock_guard lock(mu);
      for (auto& [k, why] : reasons) end_reasons[k] = std::move(why);
    }
    if (expected) {
      (void)runtime->stop_procs(mesh, kGrace);
      continue;
    }
    std::vector<std::pair<std::string, int>> alive;
    {
      std::lock_guard lock(mesh->mu);
      mesh->stopping = true;
      for (const auto& p : mesh->procs) {
        if (!p.exit && p.pid > 0) alive.emplace_back(p.id.to_string(), p.pid);
      }
    }
    if (alive.empty()) continue;
    spdlog::warn("podium: proc {} failed; killing the {} procs spawned for it", key,
                 alive.size());
    for (const auto& [k, p] : alive) (void)kill_any(k, p, SIGKILL);
  }
}

// ME-11: the sweep runs when the oldest dead record's grace is over (at most four times a
// grace period); under mu.
void Runtime::Impl::arm_sweep() {
  if (sweep_armed || shut_down) return;
  auto due = next_sweep(dead_grace);
  if (!due) return;
  if (!sweep_timer) sweep_timer = std::make_unique<base::Timer>(proc->io(), clock);
  sweep_armed = true;
  sweep_timer->expires_at(std::max(*due, now() + dead_grace / 4));
  sweep_timer->async_wait([this](std::error_code ec) {
    if (!ec) sweep_dead();
  });
}

void Runtime::Impl::sweep_dead() {
  std::vector<Dropped> dropped;
  {
    std::lock_guard lock(mu);
    sweep_armed = false;
    if (shut_down) return;
    dropped = sweep(now(), dead_grace);
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

// ME-7: a proc's end, told by the process that spawned this one, or (ME-14) by a proc this
// one spawned, which saw it end among its own procs or heard of it. The first time, it goes
// on to the others who have not heard of it from here (exit_listeners), so an end reaches
// every process of the tree, each once.
void Runtime::Impl::on_proc_exit(const actor::SystemHeader& h, const std::string& sender) {
  auto m = proto::ProcExit::decode(h);
  if (!m) return malformed(h.op, sender, m.error());
  if (!proc_gone(m->proc_key, m->pid, m->signal, m->code, m->cause, m->expected)) return;
  auto from = actor::system_sender_proc(sender);
  std::vector<channel::Address> next;
  {
    std::lock_guard lock(mu);
    if (shut_down) return;
    next = exit_listeners(m->proc_key, from ? &from->addr : nullptr);
  }
  if (next.empty()) return;
  auto note = proto::ProcExit{m->proc_key, m->cause, m->pid, m->expected, m->signal, m->code}
                  .encode();
  for (const auto& addr : next) send_to(addr, note);
}

// "actor_failed" [] [supervision id, base rank], part 1 = MeshFailure (actor layer SV-1).
void Runtime::Impl::on_actor_failed(const actor::SystemHeader& h, wire::Envelope&& env) {
  if (h.numbers.size() != 2 || env.parts.size() != 2) {
    return malformed(h.op, env.sender,
                     make_error(MeshErrc::kProtocol,
                                "expected 2 numbers and 2 parts, got " +
                                    std::to_string(h.numbers.size()) + " and " +
                                    std::to_string(env.parts.size())));
  }
  auto f = actor::decode_mesh_failure(env.parts[1]);
  if (!f) {
    spdlog::error("podium: bad failure report from {}: {}", env.sender, f.error().to_string());
    return;
  }
  supervisor->actor_failed(h.numbers[0], h.numbers[1], std::move(*f));
}

// A proc asks the controller to kill a proc whose actor did not stop.
void Runtime::Impl::on_kill(const actor::SystemHeader& h, const std::string& sender) {
  auto m = proto::KillRequest::decode(h);
  if (!m) return malformed(h.op, sender, m.error());
  kill(m->proc_key);
}

// A controller re-attached to this proc's persistent worker took it over (HA-7): requests
// for the controller (kills) go there from now on.
void Runtime::Impl::on_adopt(const actor::SystemHeader& h, const std::string& sender) {
  auto m = proto::AdoptProcs::decode(h);
  if (!m) return malformed(h.op, sender, m.error());
  auto who = actor::system_sender_proc(sender);
  if (!who || who->addr != m->controller) {
    return malformed(h.op, sender,
                     make_error(MeshErrc::kProtocol, "the sender is not the controller it names (" +
                                                         m->controller.to_string() + ")"));
  }
  std::lock_guard lock(mu);
  parent = m->controller;
}

void Runtime::Impl::kill(const std::string& key) {
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
        auto to = *parent;
        lock.unlock();
        send_to(to, proto::KillRequest{key}.encode());
      } else {
        spdlog::warn("podium: cannot kill proc {}: this process did not spawn it and has no "
                     "controller to ask",
                     key);
      }
      return;
    }
    if (auto m = it->second.mesh.lock()) {
      std::lock_guard mlock(m->mu);
      if (!m->procs[it->second.rank].exit) pid = m->procs[it->second.rank].pid;
    }
  }
  if (pid > 0) (void)spawner->kill_group(pid, SIGKILL);
}

// SIGKILL (or `sig`) to the proc `key` (pid `pid`), here or through its host's agent.
bool Runtime::Impl::kill_any(const std::string& key, pid_t pid, int sig) {
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
  return spawner->kill_group(pid, sig);
}

Result<std::shared_ptr<ProcMeshState>> Runtime::spawn_procs(
    const ndslice::Extent& extent, const std::vector<ProcLaunch>& launches) {
  auto& impl = *impl_;
  // A job on TCP puts its local procs on TCP too: procs on other hosts must reach them. A
  // client attached through a gateway (GW-1) is reached at the gateway's address, not on
  // this host: its local procs listen on Unix sockets, for it (they reach it through the
  // gateway, as every proc does); procs elsewhere cannot reach them.
  const auto& self = impl.proc->id().addr;
  bool tcp = self.transport == channel::Transport::kTcp && !impl.via;
  std::string sock_dir;
  if (!tcp) {
    auto dir = impl.socket_dir();  // ME-14: a proc makes its own at its first spawn
    if (!dir) return std::unexpected(dir.error());
    sock_dir = std::move(*dir);
  }
  auto mesh = std::make_shared<ProcMeshState>();
  mesh->extent = extent;
  mesh->spawners = lineage();  // ME-15: they die with this process (PR_SET_PDEATHSIG)
  const std::string child_lineage = encode_lineage(mesh->spawners);  // BT-5
  mesh->initialized = mesh->initialized_promise.future();
  size_t n = extent.num_ranks();
  mesh->procs.resize(n);
  {
    std::lock_guard lock(impl.mu);
    if (impl.shut_down) return std::unexpected(impl.shut_down_error());
    mesh->mesh_id = impl.next_mesh++;
  }
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
    std::string path = sock_dir + "/m" + std::to_string(mesh->mesh_id) + "-" +
                       std::to_string(r) + ".sock";
    mesh->procs[r].id = actor::ProcId{channel::Address{channel::Transport::kUnix, path, 0}};
  }
  {
    // Published once its procs' ids are filled in: on_ready reads procs.size() unlocked.
    std::lock_guard lock(impl.mu);
    impl.meshes[mesh->mesh_id] = mesh;
    for (size_t r = 0; r < n; ++r) {
      std::string key = mesh->procs[r].id.to_string();
      impl.by_key[key] = Impl::ProcRef{mesh, r, nullptr, 0};
      if (tcp) impl.reservations.emplace(key, std::move(ports[r]));
    }
  }
  for (size_t r = 0; r < n; ++r) {
    std::string key = mesh->procs[r].id.to_string();
    Boot boot{impl.proc->id().addr, mesh->procs[r].id.addr, mesh->mesh_id, r, tcp};
    ProcCommand cmd{{{kBootEnv, boot.encode()}, {kLineageEnv, child_lineage}},
                    r < launches.size() ? launches[r] : ProcLaunch{}};
    auto pid = impl.spawner->spawn(
        cmd, [&impl, key](const host::ExitStatus& s) { impl.on_exit(key, s); },
        [&impl, key](const host::ExitStatus& s) { impl.on_dying(key, s); });
    if (!pid) {
      Error e = make_error(MeshErrc::kSpawnFailed, "cannot start proc rank " + std::to_string(r) +
                                                       ": " + pid.error().to_string());
      mesh->initialized_promise.set(std::unexpected(e));
      std::lock_guard lock(mesh->mu);
      mesh->procs[r].exit = "failed to start: " + pid.error().to_string();
      return std::unexpected(e);
    }
    std::lock_guard lock(mesh->mu);
    mesh->procs[r].pid = *pid;
  }
  return mesh;
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
  for (auto& [id, pid] : alive) impl_->send_to(id.addr, actor::SystemHeader{"exit", {}, {}});
  // Escalate: whoever has not exited after the grace period is killed.
  auto timer = std::make_shared<base::Timer>(impl_->proc->io(), impl_->clock);
  timer->expires_after(grace);
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

Result<std::string> Runtime::Impl::socket_dir() {
  std::lock_guard lock(mu);
  if (shut_down) return std::unexpected(shut_down_error());
  if (sock_dir.empty()) {
    // Under mu: a second spawn waits for the first one's directory (a mkdir, no message).
    auto dir = internal::make_socket_dir();
    if (!dir) {
      return std::unexpected(make_error(MeshErrc::kSpawnFailed,
                                        "cannot make this proc's socket directory: " +
                                            dir.error().to_string()));
    }
    sock_dir = std::move(*dir);
    spdlog::debug("podium: proc {} spawns procs; their sockets are in {}", proc_key, sock_dir);
  }
  return sock_dir;
}

void Runtime::stop_spawned(std::chrono::milliseconds grace) {
  std::vector<std::shared_ptr<ProcMeshState>> live;
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->shut_down) return;
    for (auto& [id, weak] : impl_->meshes) {
      if (auto m = weak.lock(); m && !m->local) live.push_back(std::move(m));
    }
  }
  if (live.empty()) return;
  auto deadline = std::chrono::steady_clock::now() + grace;
  std::vector<actor::Future<void>> stops;
  for (auto& m : live) stops.push_back(stop_procs(m, grace));
  for (auto& f : stops) {
    auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) break;
    (void)f.get(left);  // not there in time: shutdown() kills what is left (ME-3)
  }
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

std::optional<Error> Runtime::proc_dead(const std::string& proc_key) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->dead.find(proc_key);
  if (it == impl_->dead.end()) return std::nullopt;
  return it->second;
}

void Runtime::kill_proc(const std::string& proc_key) { impl_->kill(proc_key); }

void Runtime::spawned_for(const std::shared_ptr<ProcMeshState>& mesh,
                          const std::vector<std::string>& lineage) {
  std::optional<std::string> gone;
  {
    std::lock_guard lock(impl_->mu);
    {
      std::lock_guard mlock(mesh->mu);  // ref() reads it under mesh->mu
      mesh->spawners = lineage;
    }
    for (const auto& key : lineage) {
      if (impl_->dead.contains(key)) {
        gone = key;
        break;
      }
    }
    for (const auto& key : gone ? std::vector<std::string>{} : lineage) {
      auto& list = impl_->spawned_for[key];
      // Meshes whose procs have all ended need no end: a proc that spawns and stops
      // meshes again and again keeps only its live ones here.
      std::erase_if(list, [](const auto& m) {
        std::lock_guard mlock(m->mu);
        return std::all_of(m->procs.begin(), m->procs.end(),
                           [](const ProcInfo& p) { return p.exit.has_value(); });
      });
      list.push_back(mesh);
    }
  }
  if (gone) {
    auto why = proc_dead(*gone);
    impl_->end_spawned_for(*gone, -1, why ? why->message : "ended", {mesh}, false);
  }
}

std::vector<std::string> Runtime::lineage() const {
  std::vector<std::string> out{impl_->proc_key};
  out.insert(out.end(), impl_->ancestors.begin(), impl_->ancestors.end());
  return out;
}

actor::Future<void> Runtime::procs_ended(const std::shared_ptr<ProcMeshState>& mesh) {
  std::vector<std::string> keys;
  {
    std::lock_guard lock(mesh->mu);
    for (const auto& p : mesh->procs) keys.push_back(p.id.to_string());
  }
  auto done = std::make_shared<actor::Promise<void>>();
  auto out = done->future();
  if (keys.empty()) {
    done->set({});
    return out;
  }
  // The exit watcher fails every rank of a tracked collector when its proc is gone, so a
  // collector over the procs completes exactly when the last one is.
  auto exits = std::make_shared<Collector>(keys);
  exits->future().on_ready([done, exits](const Result<Replies>&) mutable {
    done->set({});
    exits.reset();
  });
  track(exits, keys);
  return out;
}

void Runtime::watch(const std::shared_ptr<ProcMeshState>& mesh) {
  std::lock_guard lock(impl_->mu);
  impl_->add_view(mesh);
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

}  // namespace podium::mesh
