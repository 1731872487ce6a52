// Proc meshes on attached hosts, the controller side (host_client.h): spawn_procs on hosts
// (HA-2, HA-3), find_procs of a persistent worker's mesh (HA-7), and shutdown_hosts (HA-8).
#include <spdlog/spdlog.h>

#include <atomic>

#include "podium/actor/message.h"
#include "podium/mesh/host_protocol.h"
#include "podium/mesh/runtime_impl.h"
#include "podium/ndslice/codec.h"

namespace podium::mesh {

namespace {

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
      return make_error(MeshErrc::kHostLost,
                        what + ": host " + host_title(host) + " cannot be used: " + *host.failure);
    }
  }
  return std::nullopt;
}

bool timed_out(const Error& e) { return e.is(actor::ActorErrc::kTimeout); }

// On a ManualClock the clock's timers decide every deadline; a thread's own wait is then
// bounded in real time only so that a test that never advances fails instead of hanging.
constexpr std::chrono::seconds kVirtualBackstop{60};

// How long a caller's thread may wait for something the runtime's timers bound by `bound`.
std::chrono::nanoseconds thread_bound(const Runtime::Impl& impl, std::chrono::nanoseconds bound) {
  return impl.clock && impl.clock->manual() ? std::chrono::nanoseconds(kVirtualBackstop) : bound;
}

// The requests a caller's thread waits on (HA-3's bound): at the deadline, on the runtime's
// clock, each still open fails with a timeout; when the caller returns, those still open are
// forgotten (HA-13) and the timer is cancelled.
class OpenRequests {
 public:
  OpenRequests(Runtime::Impl& impl, std::vector<uint64_t> requests)
      : impl_(impl),
        requests_(std::move(requests)),
        until_(std::chrono::steady_clock::now() + impl.attach_timeout),
        timer_(impl.proc->io(), impl.clock) {
    timer_.expires_after(impl.attach_timeout);
    timer_.async_wait([ip = &impl, requests = requests_](std::error_code ec) {
      if (ec) return;
      for (uint64_t r : requests) {
        if (auto p = ip->take_request(r)) {
          p->set(std::unexpected(make_error(actor::ActorErrc::kTimeout, "no answer in time")));
        }
      }
    });
  }
  // Only the caller's thread calls the timer's members; its handler never touches it.
  ~OpenRequests() {
    timer_.cancel();
    for (uint64_t r : requests_) impl_.forget_request(r);
  }
  OpenRequests(const OpenRequests&) = delete;
  OpenRequests& operator=(const OpenRequests&) = delete;

  // How long this thread may still wait for an answer (the timer fails it at the deadline).
  std::chrono::nanoseconds left() const {
    return thread_bound(impl_, std::max(std::chrono::nanoseconds(0),
                                        until_ - std::chrono::steady_clock::now()));
  }

 private:
  Runtime::Impl& impl_;
  std::vector<uint64_t> requests_;
  std::chrono::steady_clock::time_point until_;  // the real-time bound of this thread's wait
  base::Timer timer_;
};

}  // namespace

Result<std::shared_ptr<ProcMeshState>> Runtime::spawn_procs(
    const std::shared_ptr<HostMeshState>& hosts, const std::vector<size_t>& host_ranks,
    const ndslice::Extent& extent, const std::string& name,
    const std::vector<ProcLaunch>& launches) {
  auto& impl = *impl_;
  size_t n = extent.num_ranks();
  if (!launches.empty() && launches.size() != n) {
    return std::unexpected(make_error(BaseErrc::kInvalidArgument,
                                      "spawn_procs: " + std::to_string(launches.size()) +
                                      " launches for " + std::to_string(n) + " procs"));
  }
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
  if (auto ready = hosts->initialized.get(thread_bound(impl, impl.attach_timeout + std::chrono::seconds(1))); !ready) {
    return std::unexpected(ready.error());
  }
  if (auto bad = unusable_host(*hosts, host_ranks, "spawn_procs")) return std::unexpected(*bad);
  auto mesh = std::make_shared<ProcMeshState>();
  mesh->extent = extent;
  mesh->initialized = mesh->initialized_promise.future();
  mesh->procs.resize(n);
  std::vector<actor::Future<HostTable::Answer>> answers;
  std::vector<uint64_t> requests;
  std::vector<std::pair<channel::Address, actor::SystemHeader>> spawns;
  {
    std::lock_guard lock(impl.mu);
    if (impl.shut_down) {
      return std::unexpected(impl.shut_down_error());
    }
    mesh->mesh_id = impl.next_mesh++;
    impl.meshes[mesh->mesh_id] = mesh;  // its procs' size is set; ids follow under mesh->mu
    for (size_t i = 0; i < host_ranks.size(); ++i) {
      auto [req, answer] = impl.hosts.new_request();
      answers.push_back(std::move(answer));
      requests.push_back(req);
      proto::HostSpawn spawn{impl.proc->id().addr, name, extent, req, mesh->mesh_id,
                             i * per_host, per_host};
      for (size_t j = 0; j < per_host && !launches.empty(); ++j) {
        spawn.launches.push_back(launches[i * per_host + j].encode());
      }
      spawns.emplace_back(hosts->hosts[host_ranks[i]].worker, spawn.encode());
    }
  }
  // Requests still open when this returns (a timeout, a failure) are forgotten (HA-13).
  OpenRequests open(impl, requests);
  for (auto& [worker, h] : spawns) impl.send_to(worker, std::move(h));
  for (size_t i = 0; i < host_ranks.size(); ++i) {
    size_t h = host_ranks[i];
    std::string name;
    {
      std::lock_guard lock(hosts->mu);
      name = hosts->hosts[h].hostname + " (" + hosts->hosts[h].worker.to_string() + ")";
    }
    auto got = answers[i].get(open.left());
    Error why;
    if (!got) {
      why = timed_out(got.error())
                ? make_error(MeshErrc::kSpawnFailed, "host " + name + " did not answer the spawn in time")
                : got.error();
    } else if (got->keys.size() != per_host) {
      why = make_error(MeshErrc::kProtocol, "host " + name + " answered the spawn with " +
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
      why = make_error(MeshErrc::kHostLost, "spawn_procs: host " + name + " cannot be used: " + *failure);
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
  if (auto ready = hosts->initialized.get(thread_bound(impl, impl.attach_timeout + std::chrono::seconds(1))); !ready) {
    return std::unexpected(ready.error());
  }
  if (auto bad = unusable_host(*hosts, host_ranks, "find_procs('" + name + "')")) {
    return std::unexpected(*bad);
  }
  std::vector<actor::Future<HostTable::Answer>> answers;
  std::vector<uint64_t> requests;
  std::vector<channel::Address> lookups;
  {
    std::lock_guard lock(impl.mu);
    if (impl.shut_down) {
      return std::unexpected(impl.shut_down_error());
    }
    for (size_t h : host_ranks) {
      auto [req, answer] = impl.hosts.new_request();
      answers.push_back(std::move(answer));
      requests.push_back(req);
      lookups.push_back(hosts->hosts[h].worker);
    }
  }
  OpenRequests open(impl, requests);
  for (size_t i = 0; i < lookups.size(); ++i) {
    impl.send_to(lookups[i], proto::HostLookup{impl.proc->id().addr, name, requests[i]}.encode());
  }
  auto host_name_of = [&](size_t h) {
    std::lock_guard lock(hosts->mu);
    return hosts->hosts[h].hostname + " (" + hosts->hosts[h].worker.to_string() + ")";
  };
  // Every host's part of the mesh, checked to fit together: one extent, and ranks that cover
  // it once (the hosts may be given in any order: each part says where it starts).
  std::vector<HostTable::Answer> parts;
  std::optional<ndslice::Extent> extent;
  std::vector<int> owner;  // rank -> index into host_ranks, -1: not kept by any
  for (size_t i = 0; i < host_ranks.size(); ++i) {
    auto got = answers[i].get(open.left());
    if (!got) {
      if (timed_out(got.error())) {
        return std::unexpected(make_error(BaseErrc::kTimeout,
                                          "host " + host_name_of(host_ranks[i]) +
                                              " did not answer the lookup of '" + name +
                                              "' in time"));
      }
      return invalid(got.error().message);  // the worker's refusal, naming it
    }
    auto got_extent = ndslice::decode<ndslice::Extent>(got->extent);
    if (!extent) {
      if (!got_extent) {  // HostFound::decode checked it: not reached
        return std::unexpected(make_error(MeshErrc::kProtocol,
                                          "host " + host_name_of(host_ranks[i]) +
                                              " sent a bad extent: " + got_extent.error().message));
      }
      extent = *got_extent;
      owner.assign(extent->num_ranks(), -1);
    } else if (!got_extent || *got_extent != *extent) {
      return invalid(std::string(
          "the hosts disagree on proc mesh '" + name + "': host " +
          host_name_of(host_ranks[0]) + " keeps one of extent " + extent->to_string() +
          ", host " + host_name_of(host_ranks[i]) + " one of extent " +
          (got_extent ? got_extent->to_string() : std::string("(unreadable)"))));
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
        "proc mesh '" + name + "' " + extent->to_string() + " has " +
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
      return std::unexpected(impl.shut_down_error());
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
        impl.note_dead(key, make_error(actor::ActorErrc::kProcExited, cause), impl.now());
        impl.arm_sweep();
        ++impl.dead_generation;
        if (!first_dead) {
          std::string who = "proc rank " + std::to_string(r);
          if (auto pt = mesh->extent.point_of_rank(r)) who += " " + pt->to_string();
          first_dead = make_error(actor::ActorErrc::kProcExited, who + " (pid " + std::to_string(p.pid) + ", " + key +
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
  auto adopt = proto::AdoptProcs{impl.proc->id().addr}.encode();
  for (const auto& addr : alive) impl.send_to(addr, adopt);
  return mesh;
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
    std::vector<std::pair<std::string, actor::Future<HostTable::Answer>>> answers;  // by host
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
      auto [req, answer] = impl.hosts.new_request();
      sd->answers.emplace_back(title, std::move(answer));
      sd->requests.push_back(req);
      detach.emplace_back(host.worker, req);
    }
  }
  // Attaches still unanswered fail now; an attach that was answered keeps its value.
  hosts->initialized_promise.set(
      std::unexpected(make_error(BaseErrc::kCancelled, "the host mesh was shut down")));
  for (auto& [worker, req] : detach) {
    impl.send_to(worker, proto::HostDetach{impl.proc->id().addr, req, true}.encode());
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
      for (uint64_t req : sd->requests) ip->hosts.requests.erase(req);
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
  auto timer = std::make_shared<base::Timer>(impl.proc->io(), impl.clock);
  timer->expires_after(timeout);
  timer->async_wait([timer, finish](std::error_code ec) {
    if (!ec) finish();
  });
  for (const auto& [title, answer] : sd->answers) {
    answer.on_ready([sd, finish](const Result<HostTable::Answer>&) {
      if (--sd->waiting == 0) finish();
    });
  }
  return future;
}

}  // namespace podium::mesh
