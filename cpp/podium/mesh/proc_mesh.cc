#include "podium/mesh/proc_mesh.h"

#include <spdlog/spdlog.h>

#include <asio/steady_timer.hpp>

#include "podium/actor/message.h"
#include "podium/actor/proc.h"
#include "podium/mesh/grace_timer.h"
#include "podium/supervision/supervisor.h"

namespace podium {
namespace {

actor::PortId system_port(const actor::ProcId& proc) {
  return actor::PortId{actor::ActorId{proc, std::string(actor::kSystemActorName), 0},
                       actor::kMailboxPort};
}

template <class Mesh, class Sel, class Make>
Result<Mesh> sliced(const ndslice::Region& region, std::string_view label, Sel sel, Make make) {
  auto sub = region.select(label, sel);
  if (!sub) return std::unexpected(sub.error());
  return make(std::move(*sub));
}

// A handle over `region` reshaped (a Region of the same base ranks), sharing `st`.
template <class Mesh, class State>
Result<Mesh> reshaped(const std::shared_ptr<State>& st, Result<ndslice::Region> region) {
  if (!region) return std::unexpected(region.error());
  return Mesh(st, std::move(*region));
}

// Once-ports that a dead proc will never answer are closed when the collector completes.
void close_ports_when_done(actor::Proc& proc, const mesh::Collector& c,
                           std::vector<uint64_t> ports) {
  c.future().on_ready([&proc, ports = std::move(ports)](const Result<mesh::Replies>&) {
    for (uint64_t p : ports) proc.close_port(p);
  });
}

}  // namespace

// --- ActorMeshBase -------------------------------------------------------------------------

Result<ActorMeshBase> ActorMeshBase::slice(std::string_view label, int64_t index) const {
  return sliced<ActorMeshBase>(region_, label, index,
                               [&](ndslice::Region r) { return ActorMeshBase(st_, std::move(r)); });
}

Result<ActorMeshBase> ActorMeshBase::slice(std::string_view label, ndslice::Range range) const {
  return sliced<ActorMeshBase>(region_, label, range,
                               [&](ndslice::Region r) { return ActorMeshBase(st_, std::move(r)); });
}

Result<ActorMeshBase> ActorMeshBase::split(std::string_view label, std::vector<std::string> labels,
                                           std::vector<int64_t> sizes) const {
  return reshaped<ActorMeshBase>(st_, region_.split(label, std::move(labels), std::move(sizes)));
}

Result<ActorMeshBase> ActorMeshBase::flatten(std::string label) const {
  return reshaped<ActorMeshBase>(st_, region_.flatten(std::move(label)));
}

Result<ActorMeshBase> ActorMeshBase::rename(std::string_view from, std::string to) const {
  return reshaped<ActorMeshBase>(st_, region_.rename(from, std::move(to)));
}

std::vector<const mesh::ActorTarget*> ActorMeshBase::targets_of_region(
    std::vector<size_t>* base) const {
  *base = region_.base_ranks();
  std::vector<const mesh::ActorTarget*> out;
  out.reserve(base->size());
  for (size_t b : *base) out.push_back(&st_->targets[b]);
  return out;
}

std::shared_ptr<const mesh::CastTargets> ActorMeshBase::cast_targets() const {
  std::lock_guard lock(cast_->mu);
  if (!cast_->targets) {
    std::vector<size_t> base;
    auto targets = targets_of_region(&base);
    bool whole = base.size() == st_->targets.size();  // distinct base ranks: all of them
    cast_->targets = mesh::CastTargets::build(std::move(targets), std::move(base), whole);
  }
  return cast_->targets;
}

actor::Future<mesh::Replies> ActorMeshBase::call_raw(std::string_view endpoint,
                                                     std::vector<Buffer> args) const {
  return mesh::cast(cast_targets(), region_.extent(), endpoint, std::move(args), true, st_->load,
                    st_->initialized.ready());
}

actor::Future<mesh::Replies> ActorMeshBase::call_rank_raw(size_t rank, std::string_view endpoint,
                                                          std::vector<Buffer> args) const {
  auto b = region_.base_rank(rank);
  if (!b) {
    actor::Promise<mesh::Replies> p;
    p.set(std::unexpected(b.error()));
    return p.future();
  }
  auto one = ndslice::Extent::make({}, {});
  auto to = mesh::CastTargets::build({&st_->targets[*b]}, {*b}, st_->targets.size() == 1);
  return mesh::cast(std::move(to), *one, endpoint, std::move(args), true, st_->load);
}

void ActorMeshBase::broadcast_raw(std::string_view endpoint, std::vector<Buffer> args) const {
  (void)mesh::cast(cast_targets(), region_.extent(), endpoint, std::move(args), false, nullptr,
                   st_->initialized.ready());
}

Status ActorMeshBase::cast_to_port(std::string_view endpoint, std::vector<Buffer> args,
                                   std::string_view reply_port,
                                   std::optional<size_t> only) const {
  if (!only) {
    (void)mesh::cast(cast_targets(), region_.extent(), endpoint, std::move(args), false, nullptr,
                     st_->initialized.ready(), reply_port);
    return ok();
  }
  auto b = region_.base_rank(*only);
  if (!b) return std::unexpected(b.error());
  auto one = ndslice::Extent::make({}, {});
  auto to = mesh::CastTargets::build({&st_->targets[*b]}, {*b}, st_->targets.size() == 1);
  (void)mesh::cast(std::move(to), *one, endpoint, std::move(args), false, nullptr, false,
                   reply_port);
  return ok();
}

Result<std::shared_ptr<mesh::ReplyStream>> ActorMeshBase::stream_raw(
    std::string_view endpoint, std::vector<std::vector<Buffer>> per_rank) const {
  if (per_rank.size() != size()) {
    return std::unexpected(make_error(
        BaseErrc::kInvalidArgument, "stream('" + std::string(endpoint) + "') on mesh '" +
                                        name() + "': one list of arguments per rank expected (" +
                                        std::to_string(size()) + "), got " +
                                        std::to_string(per_rank.size())));
  }
  std::vector<actor::Future<mesh::Replies>> calls;
  calls.reserve(per_rank.size());
  for (size_t r = 0; r < per_rank.size(); ++r) {
    calls.push_back(call_rank_raw(r, endpoint, std::move(per_rank[r])));
  }
  return mesh::ReplyStream::make(calls);
}

size_t ActorMeshBase::least_loaded_rank() const {
  auto base = region_.base_ranks();
  size_t best = 0;
  int64_t best_load = INT64_MAX;
  for (size_t r = 0; r < base.size(); ++r) {
    int64_t l = st_->load->outstanding[base[r]].load(std::memory_order_relaxed);
    if (l < best_load) {
      best_load = l;
      best = r;
    }
  }
  return best;
}

actor::Future<mesh::Replies> ActorMeshBase::stop(std::chrono::milliseconds grace) const {
  auto& rt = mesh::Runtime::get();
  std::vector<size_t> base;
  auto targets = targets_of_region(&base);
  if (st_->supervision_id != 0) rt.supervisor().stopping(st_->supervision_id, base);
  std::vector<std::string> keys;
  for (const auto* t : targets) keys.push_back(t->proc_key);
  auto collector = std::make_shared<mesh::Collector>(keys);
  // One once-port per actor keeps each reply matched to its rank.
  std::vector<uint64_t> ports;
  for (size_t r = 0; r < targets.size(); ++r) {
    auto p = rt.proc().open_port(
        [collector, r](wire::Envelope&& env) {
          collector->fill(r, mesh::decode_reply(std::move(env)).second);
        },
        true);
    wire::Envelope env;
    env.kind = static_cast<uint8_t>(actor::MessageKind::kSystem);
    env.dest = system_port(st_->procs->procs[base[r]].id).to_string();
    env.headers.emplace_back(actor::kReplyHeader, p.to_string());
    ports.push_back(p.port);
    std::string key = actor::ActorId{{}, st_->name, static_cast<uint32_t>(base[r])}.local_key();
    env.parts.push_back(actor::encode_system_header(actor::SystemHeader{"stop", {key}, {}}));
    rt.proc().send(targets[r]->addr, std::move(env));
  }
  close_ports_when_done(rt.proc(), *collector, std::move(ports));
  rt.track(collector, keys);
  // ME-8: whoever has not stopped after `grace` is hung; its proc is killed.
  std::vector<std::string> actors;
  for (const auto* t : targets) actors.push_back(t->actor);
  auto timer = std::make_shared<asio::steady_timer>(rt.proc().io(), grace);
  timer->async_wait([timer, collector, keys, actors, grace](std::error_code ec) {
    if (ec || collector->future().ready()) return;
    auto& runtime = mesh::Runtime::get();
    for (size_t r = 0; r < keys.size(); ++r) {
      if (collector->filled(r)) continue;
      if (keys[r] == runtime.proc_key()) {
        spdlog::warn("podium: actor {} did not stop within {} ms; it runs in this process, "
                     "which cannot kill itself: giving up on it",
                     actors[r], grace.count());
      } else {
        spdlog::warn("podium: actor {} did not stop within {} ms; killing its proc {}",
                     actors[r], grace.count(), keys[r]);
        runtime.kill_proc(keys[r]);
      }
      collector->fill(r, std::vector<Buffer>{});
    }
  });
  cancel_when_ready(timer, collector->future());
  return collector->future();
}

// --- ProcMesh ------------------------------------------------------------------------------

Result<ProcMesh> ProcMesh::slice(std::string_view label, int64_t index) const {
  return sliced<ProcMesh>(region_, label, index,
                          [&](ndslice::Region r) { return ProcMesh(st_, std::move(r)); });
}

Result<ProcMesh> ProcMesh::slice(std::string_view label, ndslice::Range range) const {
  return sliced<ProcMesh>(region_, label, range,
                          [&](ndslice::Region r) { return ProcMesh(st_, std::move(r)); });
}

Result<ProcMesh> ProcMesh::split(std::string_view label, std::vector<std::string> labels,
                                 std::vector<int64_t> sizes) const {
  return reshaped<ProcMesh>(st_, region_.split(label, std::move(labels), std::move(sizes)));
}

Result<ProcMesh> ProcMesh::flatten(std::string label) const {
  return reshaped<ProcMesh>(st_, region_.flatten(std::move(label)));
}

Result<ProcMesh> ProcMesh::rename(std::string_view from, std::string to) const {
  return reshaped<ProcMesh>(st_, region_.rename(from, std::move(to)));
}

Result<ActorMeshBase> ProcMesh::spawn_raw(std::string_view type, std::string name,
                                          std::vector<Buffer> args,
                                          std::optional<std::string> owner) const {
  return start_actors(name, std::move(owner), [&](size_t base, uint64_t supervision,
                                                             const std::string& supervisor) {
    actor::SystemHeader h{"spawn", {std::string(type), name}, {base}};
    if (supervision != 0) {
      h.args.push_back(supervisor);
      h.numbers.push_back(supervision);
    }
    std::vector<Buffer> parts{actor::encode_system_header(h)};
    parts.insert(parts.end(), args.begin(), args.end());
    return parts;
  });
}

Result<ActorMeshBase> ProcMesh::adopt_raw(std::string name,
                                          std::optional<std::string> owner) const {
  return start_actors(name, std::move(owner), [&](size_t base, uint64_t supervision,
                                                             const std::string& supervisor) {
    // SV-5: the actor's failures are reported here from now on (to nobody: not supervised).
    actor::SystemHeader h{"adopt", {name, supervision != 0 ? supervisor : std::string()},
                          {base, supervision}};
    return std::vector<Buffer>{actor::encode_system_header(h)};
  });
}

Result<ActorMeshBase> ProcMesh::start_actors(
    std::string name, std::optional<std::string> owner,
    const std::function<std::vector<Buffer>(size_t, uint64_t, const std::string&)>& message)
    const {
  if (auto st = actor::ActorId::check_name(name); !st) return std::unexpected(st.error());
  auto& rt = mesh::Runtime::get();
  auto state = std::make_shared<mesh::ActorMeshState>();
  state->name = name;
  state->procs = st_;
  size_t total = st_->procs.size();
  state->targets.resize(total);
  state->load = std::make_shared<mesh::LoadCounters>(total);
  auto base = region_.base_ranks();
  std::vector<std::string> keys;
  for (size_t b : base) {
    const auto& pid = st_->procs[b].id;
    actor::ActorId aid{pid, name, static_cast<uint32_t>(b)};
    auto& t = state->targets[b];
    t.addr = pid.addr;
    t.dest = actor::PortId{aid, actor::kMailboxPort}.to_string();
    t.actor = aid.to_string();
    t.proc_key = pid.to_string();
    t.host = st_->procs[b].host;
    keys.push_back(t.proc_key);
  }
  // SV-1: the actors report their failures to this process, which raises them to the owner.
  if (owner) {
    if (owner->empty()) {
      if (const std::string* me = actor::current_actor_text()) *owner = *me;
    }
    mesh::Supervisor::Spawned s;
    s.name = name;
    s.owner = *owner;
    s.extent = st_->extent;
    s.base_ranks = base;
    std::lock_guard lock(st_->mu);
    for (size_t b : base) {
      s.proc_keys.push_back(state->targets[b].proc_key);
      s.actor_ids.push_back(state->targets[b].actor);
      s.pids.push_back(st_->procs[b].pid);
      s.hosts.push_back(st_->procs[b].host);
    }
    state->supervision_id = rt.supervisor().add(std::move(s));
  }
  // The spawn replies (one per actor, once its constructor ran) complete `initialized`.
  auto collector = std::make_shared<mesh::Collector>(keys);
  actor::Promise<void> init_promise;
  state->initialized = init_promise.future();
  collector->future().on_ready(
      [p = std::make_shared<actor::Promise<void>>(std::move(init_promise)), state,
       base](const Result<mesh::Replies>& replies) {
        // Abandoned: this process stopped its runtime before every actor had answered.
        if (!replies) {
          Error why = replies.error();
          why.message = "the actors of mesh '" + state->name +
                        "' had not all started when this process shut down (" + why.message +
                        ")";
          return (void)p->set(std::unexpected(std::move(why)));
        }
        if (auto failed = replies->first_error()) {
          // Named by its rank in the ProcMesh, as supervision names it.
          size_t b = base[failed->first];
          const auto& t = state->targets[b];
          int64_t pid = -1;
          {
            std::lock_guard lock(state->procs->mu);
            pid = state->procs->procs[b].pid;
          }
          p->set(std::unexpected(
              mesh::rank_error(state->procs->extent, b, t, *failed->second, pid)));
          return;
        }
        p->set({});
      });
  std::vector<uint64_t> ports;
  for (size_t r = 0; r < base.size(); ++r) {
    const auto& pid = st_->procs[base[r]].id;
    auto port = rt.proc().open_port(
        [collector, r](wire::Envelope&& env) {
          collector->fill(r, mesh::decode_reply(std::move(env)).second);
        },
        true);
    wire::Envelope env;
    env.kind = static_cast<uint8_t>(actor::MessageKind::kSystem);
    env.dest = system_port(pid).to_string();
    ports.push_back(port.port);
    env.headers.emplace_back(actor::kReplyHeader, port.to_string());
    env.parts = message(base[r], state->supervision_id, rt.proc_key());
    rt.proc().send(pid.addr, std::move(env));
  }
  close_ports_when_done(rt.proc(), *collector, std::move(ports));
  rt.track(collector, keys);
  return ActorMeshBase(std::move(state), region_);
}

std::optional<std::string> ProcMesh::exit_status(size_t rank) const {
  auto b = region_.base_rank(rank);
  if (!b) return std::nullopt;
  std::lock_guard lock(st_->mu);
  return st_->procs[*b].exit;
}

int ProcMesh::pid(size_t rank) const {
  auto b = region_.base_rank(rank);
  if (!b) return -1;
  std::lock_guard lock(st_->mu);
  return st_->procs[*b].pid;
}

void ProcMesh::spawned_for(const std::vector<std::string>& lineage) const {
  mesh::Runtime::get().spawned_for(st_, lineage);
}

actor::Future<void> ProcMesh::ended() const { return mesh::Runtime::get().procs_ended(st_); }

actor::Future<void> ProcMesh::stop(std::chrono::milliseconds grace) const {
  return mesh::Runtime::get().stop_procs(st_, grace);
}

actor::Future<void> ProcMesh::stop_after(std::vector<actor::Future<mesh::Replies>> first,
                                         std::chrono::milliseconds wait,
                                         std::chrono::milliseconds grace) const {
  struct Chain {
    std::mutex mu;  // guards started, remaining
    bool started = false;
    size_t remaining = 0;
    actor::Promise<void> done;
  };
  auto chain = std::make_shared<Chain>();
  auto out = chain->done.future();
  // ME-12: whichever comes first starts the stop; the others find it started.
  auto go = [chain, self = *this, grace] {
    {
      std::lock_guard lock(chain->mu);
      if (chain->started) return;
      chain->started = true;
    }
    self.stop(grace).on_ready([chain](const Result<void>& r) { chain->done.set(r); });
  };
  chain->remaining = first.size();
  if (first.empty()) {
    go();
    return out;
  }
  // The timer owns itself until it fires or is cancelled, once the chain is done (its wait
  // holds this mesh and the chain: grace_timer.h).
  auto timer = std::make_shared<asio::steady_timer>(mesh::Runtime::get().proc().io(), wait);
  timer->async_wait([timer, go](std::error_code ec) {
    if (!ec) go();
  });
  mesh::cancel_when_ready(timer, out);
  for (const auto& f : first) {
    f.on_ready([chain, go](const Result<mesh::Replies>&) {
      bool last;
      {
        std::lock_guard lock(chain->mu);
        last = --chain->remaining == 0;
      }
      if (last) go();
    });
  }
  return out;
}

Result<ProcMesh> HostMesh::find_procs(const std::string& name) const {
  if (!st_) {
    return std::unexpected(make_error(BaseErrc::kInvalidArgument,
                                      "find_procs('" + name + "'): proc meshes are found by name "
                                      "on attached workers (attach_to_workers), not on this host"));
  }
  auto st = mesh::Runtime::get().find_procs(st_, region_.base_ranks(), name);
  if (!st) return std::unexpected(st.error());
  ndslice::Region region((*st)->extent);
  return ProcMesh(std::move(*st), std::move(region));
}

Result<ProcMesh> HostMesh::spawn_procs(
    const std::vector<std::pair<std::string, size_t>>& per_host, const std::string& name,
    const std::vector<mesh::ProcLaunch>& launches) const {
  std::vector<std::string> labels;
  std::vector<size_t> sizes;
  if (st_) {
    labels = region_.extent().labels();
    sizes = region_.extent().sizes();
  }
  for (const auto& [l, s] : per_host) {
    labels.push_back(l);
    sizes.push_back(s);
  }
  auto extent = ndslice::Extent::make(std::move(labels), std::move(sizes));
  if (!extent) return std::unexpected(extent.error());
  if (!launches.empty() && launches.size() != extent->num_ranks()) {
    return std::unexpected(make_error(BaseErrc::kInvalidArgument,
                                      "spawn_procs: " + std::to_string(launches.size()) +
                                      " launches for " + std::to_string(extent->num_ranks()) +
                                      " procs"));
  }
  for (const auto& launch : launches) {  // LA-1: a launch the spawner would refuse fails here
    if (auto checked = mesh::ProcLaunch::decode(launch.encode()); !checked) {
      return std::unexpected(checked.error());
    }
  }
  auto st = st_ ? mesh::Runtime::get().spawn_procs(st_, region_.base_ranks(), *extent, name,
                                                   launches)
                : mesh::Runtime::get().spawn_procs(*extent, launches);
  if (!st) return std::unexpected(st.error());
  return ProcMesh(std::move(*st), ndslice::Region(*extent));
}

Result<channel::Address> parse_worker_address(std::string_view text) {
  auto w = channel::parse_worker_address(text);  // CH-24
  if (!w) return std::unexpected(make_error(BaseErrc::kInvalidArgument, w.error().message));
  if (w->fd >= 0 && !w->alias) {
    return std::unexpected(make_error(BaseErrc::kInvalidArgument,
                                      "worker address '" + std::string(text) +
                                          "': a descriptor (fdN) is for serving; dial "
                                          "tcp://HOST:PORT"));
  }
  return w->dial;  // DIAL of DIAL@BIND: what a controller dials
}

Result<HostMesh> HostMesh::attach(const std::vector<std::string>& workers) {
  std::vector<channel::Address> addrs;
  for (const auto& w : workers) {
    auto a = parse_worker_address(w);
    if (!a) return std::unexpected(a.error());
    addrs.push_back(std::move(*a));
  }
  auto st = mesh::Runtime::get().attach(std::move(addrs));
  if (!st) return std::unexpected(st.error());
  auto extent = ndslice::Extent::make({"hosts"}, {workers.size()});
  if (!extent) return std::unexpected(extent.error());
  return HostMesh(std::move(*st), ndslice::Region(*extent));
}

actor::Future<void> HostMesh::initialized() const {
  if (st_) return st_->initialized;
  actor::Promise<void> p;
  p.set({});
  return p.future();
}

Result<actor::Future<void>> HostMesh::shutdown() const {
  if (!st_) {
    return std::unexpected(make_error(BaseErrc::kInvalidArgument,
                                      "shutdown(): this_host() is the controller's own host; "
                                      "stop the ProcMeshes spawned on it instead"));
  }
  return mesh::Runtime::get().shutdown_hosts(st_, region_.base_ranks());
}

Result<HostMesh> HostMesh::slice(std::string_view label, int64_t index) const {
  return sliced<HostMesh>(region_, label, index,
                          [&](ndslice::Region r) { return HostMesh(st_, std::move(r)); });
}

Result<HostMesh> HostMesh::slice(std::string_view label, ndslice::Range range) const {
  return sliced<HostMesh>(region_, label, range,
                          [&](ndslice::Region r) { return HostMesh(st_, std::move(r)); });
}

HostMesh this_host() { return HostMesh{}; }

ProcMesh this_proc() {
  auto st = mesh::Runtime::get().this_proc();
  return ProcMesh(st, ndslice::Region(*ndslice::Extent::make({}, {})));
}

}  // namespace podium
