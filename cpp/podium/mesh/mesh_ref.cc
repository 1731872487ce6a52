#include "podium/mesh/mesh_ref.h"

#include <msgpack.hpp>

#include <algorithm>
#include <mutex>
#include <span>
#include <utility>

#include "podium/actor/mesh_failure.h"
#include "podium/mesh/proc_mesh.h"
#include "podium/mesh/runtime.h"
#include "podium/wire/peer_msgpack.h"

namespace podium {
namespace {

Error ref_error(std::string msg) {
  return make_error(BaseErrc::kInvalidArgument, std::move(msg));
}

// --- the msgpack form (docs/mesh.md, "Mesh refs") -------------------------------------------

struct RegionWire {
  std::vector<std::string> labels;
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  std::vector<uint64_t> strides;
  MSGPACK_DEFINE(labels, offset, sizes, strides);
};

struct ProcWire {
  std::string id;
  int64_t pid = -1;
  std::string host;
  MSGPACK_DEFINE(id, pid, host);
};

struct ProcMeshWire {
  std::vector<std::string> labels;
  std::vector<uint64_t> sizes;
  std::vector<ProcWire> procs;
  RegionWire region;
  std::vector<std::string> spawners;
  MSGPACK_DEFINE(labels, sizes, procs, region, spawners);
};

struct ActorWire {
  std::string addr, dest, actor, proc_key;
  MSGPACK_DEFINE(addr, dest, actor, proc_key);
};

struct ActorMeshWire {
  std::string name;
  ProcMeshWire procs;
  std::vector<std::optional<ActorWire>> targets;
  MSGPACK_DEFINE(name, procs, targets);
};

std::vector<uint64_t> to_u64(const std::vector<size_t>& v) { return {v.begin(), v.end()}; }
std::vector<size_t> to_size(const std::vector<uint64_t>& v) { return {v.begin(), v.end()}; }

ProcMeshWire to_wire(const mesh::ProcMeshRef& r) {
  ProcMeshWire w;
  w.labels = r.labels;
  w.sizes = to_u64(r.sizes);
  for (const auto& p : r.procs) w.procs.push_back(ProcWire{p.id, p.pid, p.host});
  const auto& s = r.region.slice();
  w.region = RegionWire{r.region.labels(), s.offset(), to_u64(s.sizes()), to_u64(s.strides())};
  w.spawners = r.spawners;
  return w;
}

Result<mesh::ProcMeshRef> from_wire(ProcMeshWire&& w) {
  mesh::ProcMeshRef r;
  r.labels = std::move(w.labels);
  r.sizes = to_size(w.sizes);
  for (auto& p : w.procs) {
    r.procs.push_back(mesh::ProcRef{std::move(p.id), p.pid, std::move(p.host)});
  }
  auto slice = ndslice::Slice::make(w.region.offset, to_size(w.region.sizes),
                                    to_size(w.region.strides));
  if (!slice) return std::unexpected(slice.error());
  auto region = ndslice::Region::make(std::move(w.region.labels), std::move(*slice));
  if (!region) return std::unexpected(region.error());
  r.region = std::move(*region);
  r.spawners = std::move(w.spawners);
  return r;
}

template <class T>
Buffer pack(const T& v) {
  msgpack::sbuffer sb;
  msgpack::pack(sb, v);
  return Buffer::copy_of(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(sb.data()), sb.size()));
}

template <class T>
Result<T> unpack(const Buffer& b, std::string_view what) {
  try {
    auto data = reinterpret_cast<const char*>(b.data());
    msgpack::object_handle oh = msgpack::unpack(data, b.size(), nullptr, nullptr,
                                                wire::peer_unpack_limit(b.size()));  // WI-7
    return oh.get().as<T>();
  } catch (const std::exception& e) {
    return std::unexpected(ref_error("malformed " + std::string(what) + ": " + e.what()));
  }
}

// The host a ref names for `host` as ProcInfo holds it (empty: this host; MR-2).
std::string spelled_host(const std::string& host) {
  return host.empty() ? actor::host_name() : host;
}

mesh::ProcMeshRef procs_ref(mesh::ProcMeshState& st, const ndslice::Region& region) {
  mesh::ProcMeshRef out;
  out.labels = st.extent.labels();
  out.sizes = st.extent.sizes();
  out.region = region;
  out.spawners = st.spawners;
  std::lock_guard lock(st.mu);
  for (const auto& p : st.procs) {
    out.procs.push_back(mesh::ProcRef{p.id.to_string(), p.pid, spelled_host(p.host)});
  }
  return out;
}

// MR-3: the state of a mesh this process did not spawn, every proc registered and
// `initialized` resolved (the spawner owns and watches the procs).
Result<std::shared_ptr<mesh::ProcMeshState>> procs_from_ref(const mesh::ProcMeshRef& ref) {
  auto extent = ndslice::Extent::make(ref.labels, ref.sizes);
  if (!extent) return std::unexpected(extent.error());
  size_t n = extent->num_ranks();
  if (ref.procs.size() != n) {
    return std::unexpected(ref_error("mesh ref: one proc per rank of the root extent " +
                                     extent->to_string() + " expected, got " +
                                     std::to_string(ref.procs.size())));
  }
  auto base = ref.region.base_ranks();
  if (auto it = std::find_if(base.begin(), base.end(), [n](size_t b) { return b >= n; });
      it != base.end()) {
    return std::unexpected(ref_error("mesh ref: region " + ref.region.to_string() +
                                     " addresses base rank " + std::to_string(*it) +
                                     " of a root mesh of " + std::to_string(n)));
  }
  auto st = std::make_shared<mesh::ProcMeshState>();
  st->extent = std::move(*extent);
  st->spawners = ref.spawners;  // ME-15: watch() indexes the view by them
  for (const auto& p : ref.procs) {
    auto addr = channel::Address::parse(p.id);
    if (!addr) return std::unexpected(addr.error());
    st->procs.push_back(mesh::ProcInfo{actor::ProcId{std::move(*addr)},
                                       static_cast<int>(p.pid), true, std::nullopt, p.host});
  }
  st->ready_count = st->procs.size();
  st->initialized = st->initialized_promise.future();
  st->initialized_promise.set({});
  // Calls through it to a proc that ended fail with the reason for as long as it lives
  // (runtime ME-11).
  mesh::Runtime::get().watch(st);
  return st;
}

}  // namespace

namespace mesh {

Buffer encode(const ProcMeshRef& ref) { return pack(to_wire(ref)); }

Buffer encode(const ActorMeshRef& ref) {
  ActorMeshWire w;
  w.name = ref.name;
  w.procs = to_wire(ref.procs);
  for (const auto& t : ref.targets) {
    if (t) {
      w.targets.emplace_back(ActorWire{t->addr, t->dest, t->actor, t->proc_key});
    } else {
      w.targets.emplace_back(std::nullopt);
    }
  }
  return pack(w);
}

Result<ProcMeshRef> decode_proc_mesh_ref(const Buffer& bytes) {
  auto w = unpack<ProcMeshWire>(bytes, "proc mesh ref");
  if (!w) return std::unexpected(w.error());
  return from_wire(std::move(*w));
}

Result<ActorMeshRef> decode_actor_mesh_ref(const Buffer& bytes) {
  auto w = unpack<ActorMeshWire>(bytes, "actor mesh ref");
  if (!w) return std::unexpected(w.error());
  auto procs = from_wire(std::move(w->procs));
  if (!procs) return std::unexpected(procs.error());
  ActorMeshRef out;
  out.name = std::move(w->name);
  out.procs = std::move(*procs);
  for (auto& t : w->targets) {
    if (t) {
      out.targets.emplace_back(ActorRef{std::move(t->addr), std::move(t->dest),
                                        std::move(t->actor), std::move(t->proc_key)});
    } else {
      out.targets.emplace_back(std::nullopt);
    }
  }
  return out;
}

}  // namespace mesh

// --- handles <-> refs ------------------------------------------------------------------------

mesh::ProcMeshRef ProcMesh::ref() const { return procs_ref(*st_, region_); }

Result<ProcMesh> ProcMesh::from_ref(const mesh::ProcMeshRef& ref) {
  auto st = procs_from_ref(ref);
  if (!st) return std::unexpected(st.error());
  return ProcMesh(std::move(*st), ref.region);
}

mesh::ActorMeshRef ActorMeshBase::ref() const {
  mesh::ActorMeshRef out;
  out.name = st_->name;
  out.procs = procs_ref(*st_->procs, region_);
  for (const auto& t : st_->targets) {
    if (t.dest.empty()) {
      out.targets.emplace_back(std::nullopt);
    } else {
      out.targets.emplace_back(mesh::ActorRef{t.addr.to_string(), t.dest, t.actor, t.proc_key});
    }
  }
  return out;
}

Result<ActorMeshBase> ActorMeshBase::from_ref(const mesh::ActorMeshRef& ref) {
  auto procs = procs_from_ref(ref.procs);
  if (!procs) return std::unexpected(procs.error());
  auto st = std::make_shared<mesh::ActorMeshState>();
  st->name = ref.name;
  st->procs = std::move(*procs);
  if (ref.targets.size() != st->procs->procs.size()) {
    return std::unexpected(ref_error("actor mesh ref '" + ref.name +
                                     "': one target per rank of the root extent expected (" +
                                     std::to_string(st->procs->procs.size()) + "), got " +
                                     std::to_string(ref.targets.size())));
  }
  for (size_t b = 0; b < ref.targets.size(); ++b) {
    mesh::ActorTarget target;
    if (const auto& t = ref.targets[b]) {
      auto addr = channel::Address::parse(t->addr);
      if (!addr) return std::unexpected(addr.error());
      target.addr = std::move(*addr);
      target.dest = t->dest;
      target.actor = t->actor;
      target.proc_key = t->proc_key;
      target.host = st->procs->procs[b].host;
    }
    st->targets.push_back(std::move(target));
  }
  st->load = std::make_shared<mesh::LoadCounters>(st->targets.size());
  actor::Promise<void> init;
  st->initialized = init.future();
  init.set({});
  return ActorMeshBase(std::move(st), ref.procs.region);
}

Result<mesh::RankInfo> ActorMeshBase::rank_info(size_t rank) const {
  auto b = region_.base_rank(rank);
  if (!b) return std::unexpected(b.error());
  mesh::RankInfo out;
  out.actor = st_->targets[*b].actor;
  out.base_rank = *b;
  {
    std::lock_guard lock(st_->procs->mu);
    const auto& p = st_->procs->procs[*b];
    out.pid = p.pid;
    out.host = spelled_host(p.host);  // ME-13: the proc's host, not this process's
  }
  if (auto point = st_->procs->extent.point_of_rank(*b)) out.point = point->to_string();
  return out;
}

std::vector<mesh::HostInfo> HostMesh::hosts() const {
  std::vector<mesh::HostInfo> out;
  if (!st_) return out;
  std::lock_guard lock(st_->mu);
  for (const auto& h : st_->hosts) {
    out.push_back(mesh::HostInfo{h.worker.to_string(), h.hostname, h.attached, h.failure});
  }
  return out;
}

}  // namespace podium
