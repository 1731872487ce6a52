// podium::HostMesh, ProcMesh and the untyped ActorMeshBase — handles on groups of procs and
// actors, shaped by an ndslice::Region. Handles are cheap to copy; slices share the state of
// the mesh they come from.
//
//   auto procs = podium::this_host().spawn_procs({{"procs", 4}});
//   auto counters = procs->spawn<Counter>("counter", 0);
//   auto all = counters->call(&Counter::incr, 1).get();        // ValueMesh<int>
//   auto one = counters->slice("procs", 2)->call_one(&Counter::incr, 1).get();
//
// Invariants:
//   ME-5 An actor mesh's `initialized` resolves when every actor's constructor has run (ok),
//        or with the first failure naming the rank and cause.
//   ME-6 Messages from one sender to one actor are delivered in send order, directly or
//        through the cast tree (AC-11 sequence numbers; relay.h, docs/cast.md).
//   ME-8 ActorMeshBase::stop() completes within its grace period plus the time to kill: an
//        actor that does not stop in time has its proc killed, and a warning names it. An
//        actor on the controller's own proc cannot be killed: the warning says so.
//   ME-12 ProcMesh::stop_after() stops the procs once every future it was given is ready
//        (whatever its outcome) or once `wait` has passed, whichever comes first, exactly once.
//   ME-13 rank_info() and a rank's errors name the host the rank's proc runs on (its
//        ProcInfo::host; this host's name when it runs here), never the host of the process
//        that asks (supervision SV-4).
//
// Handles and refs: ref() / from_ref() turn a handle into plain values and back (mesh_ref.h);
// the state a handle shares with its slices is private to this layer.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "podium/actor/future.h"
#include "podium/mesh/cast.h"
#include "podium/mesh/mesh_ref.h"
#include "podium/mesh/runtime.h"
#include "podium/ndslice/range.h"
#include "podium/ndslice/region.h"

namespace podium {

namespace mesh {
struct ActorMeshState {
  std::string name;
  std::shared_ptr<ProcMeshState> procs;
  std::vector<ActorTarget> targets;  // by base rank of `procs`; empty dest where not spawned
  std::shared_ptr<LoadCounters> load;
  actor::Future<void> initialized;
  uint64_t supervision_id = 0;  // its entry in this process's Supervisor; 0: not owned here
};
}  // namespace mesh

class ActorMeshBase {
 public:
  ActorMeshBase(std::shared_ptr<mesh::ActorMeshState> st, ndslice::Region region)
      : st_(std::move(st)), region_(std::move(region)), cast_(std::make_shared<CastCache>()) {}

  const ndslice::Region& region() const { return region_; }
  const ndslice::Extent& extent() const { return region_.extent(); }
  size_t size() const { return region_.num_ranks(); }
  const std::string& name() const { return st_->name; }

  [[nodiscard]] Result<ActorMeshBase> slice(std::string_view label, int64_t index) const;
  [[nodiscard]] Result<ActorMeshBase> slice(std::string_view label, ndslice::Range range) const;
  // The same actors in another shape (ndslice::Region::split / flatten / rename).
  [[nodiscard]] Result<ActorMeshBase> split(std::string_view label,
                                            std::vector<std::string> labels,
                                            std::vector<int64_t> sizes) const;
  [[nodiscard]] Result<ActorMeshBase> flatten(std::string label) const;
  [[nodiscard]] Result<ActorMeshBase> rename(std::string_view from, std::string to) const;

  // This handle as plain values (mesh_ref.h, MR-1), and back: a handle on actors another
  // process spawned, whose `initialized` is resolved (the spawner owns and watches them).
  mesh::ActorMeshRef ref() const;
  [[nodiscard]] static Result<ActorMeshBase> from_ref(const mesh::ActorMeshRef& ref);
  // Who and where rank `rank` of this region is (ME-13); kOutOfRange.
  [[nodiscard]] Result<mesh::RankInfo> rank_info(size_t rank) const;

  // Resolves once every actor of the whole mesh has been constructed (ME-5).
  actor::Future<void> initialized() const { return st_->initialized; }

  // Calls `endpoint` on every actor of this region; replies by rank (ME-1, ME-2).
  actor::Future<mesh::Replies> call_raw(std::string_view endpoint, std::vector<Buffer> args) const;
  // Calls `endpoint` on one actor, given by its rank in this region.
  actor::Future<mesh::Replies> call_rank_raw(size_t rank, std::string_view endpoint,
                                             std::vector<Buffer> args) const;
  // One-way to every actor of this region.
  void broadcast_raw(std::string_view endpoint, std::vector<Buffer> args) const;
  // One-way to every actor of this region (or to rank `only` alone, then as a mesh of no
  // dimensions, like call_rank_raw), each answering `reply_port` (a PortId text; empty:
  // nowhere) with its rank. Through the cast tree like broadcast_raw (mesh::cast CS-1).
  // kOutOfRange when `only` is not a rank of this region.
  [[nodiscard]] Status cast_to_port(std::string_view endpoint, std::vector<Buffer> args,
                                    std::string_view reply_port,
                                    std::optional<size_t> only = std::nullopt) const;
  // Calls `endpoint` on every rank r with `per_rank[r]`; the replies in arrival order (CS-2).
  // kInvalidArgument unless there is one argument list per rank.
  [[nodiscard]] Result<std::shared_ptr<mesh::ReplyStream>> stream_raw(
      std::string_view endpoint, std::vector<std::vector<Buffer>> per_rank) const;
  // The rank with the fewest calls outstanding (ties: the lowest rank).
  size_t least_loaded_rank() const;

  // Stops every actor of this region after the messages queued before the stop (AC-9). An
  // actor that has not stopped after `grace` (hung in a handler) has its proc killed, with a
  // warning that says so (ME-8); its rank then counts as stopped.
  actor::Future<mesh::Replies> stop(
      std::chrono::milliseconds grace = std::chrono::seconds(10)) const;

 protected:
  std::vector<const mesh::ActorTarget*> targets_of_region(std::vector<size_t>* base) const;

  // This region's CastTargets, built by its first cast and shared by its copies.
  std::shared_ptr<const mesh::CastTargets> cast_targets() const;

  std::shared_ptr<mesh::ActorMeshState> st_;
  ndslice::Region region_;
  struct CastCache {
    std::mutex mu;  // guards targets
    std::shared_ptr<const mesh::CastTargets> targets;
  };
  std::shared_ptr<CastCache> cast_;
};

template <class A>
class ActorMesh;

class ProcMesh {
 public:
  ProcMesh(std::shared_ptr<mesh::ProcMeshState> st, ndslice::Region region)
      : st_(std::move(st)), region_(std::move(region)) {}

  const ndslice::Region& region() const { return region_; }
  const ndslice::Extent& extent() const { return region_.extent(); }
  size_t size() const { return region_.num_ranks(); }

  [[nodiscard]] Result<ProcMesh> slice(std::string_view label, int64_t index) const;
  [[nodiscard]] Result<ProcMesh> slice(std::string_view label, ndslice::Range range) const;
  // The same procs in another shape (ndslice::Region::split / flatten / rename).
  [[nodiscard]] Result<ProcMesh> split(std::string_view label, std::vector<std::string> labels,
                                       std::vector<int64_t> sizes) const;
  [[nodiscard]] Result<ProcMesh> flatten(std::string label) const;
  [[nodiscard]] Result<ProcMesh> rename(std::string_view from, std::string to) const;

  // This handle as plain values (mesh_ref.h, MR-1), and back: a handle on procs another
  // process spawned, every proc registered and `initialized` resolved; calls through it to a
  // proc that ended fail with the reason (runtime ME-11).
  mesh::ProcMeshRef ref() const;
  [[nodiscard]] static Result<ProcMesh> from_ref(const mesh::ProcMeshRef& ref);

  // Resolves when every proc of the mesh has registered (ME-4).
  actor::Future<void> initialized() const { return st_->initialized; }

  // Spawns `name[rank]` of registered type `type` on every proc of this region; returns at
  // once. `args` are the constructor's arguments, encoded for that type. `owner` is who
  // supervises the new mesh (supervisor.h): an ActorId text, or empty for the actor whose
  // handler runs on this thread, else this process's root; nullopt: nobody (podium's own
  // bootstrap actors).
  [[nodiscard]] Result<ActorMeshBase> spawn_raw(
      std::string_view type, std::string name, std::vector<Buffer> args,
      std::optional<std::string> owner = std::string()) const;

  template <class A, class... Args>
  [[nodiscard]] Result<ActorMesh<A>> spawn(std::string name, Args&&... args) const;

  // The actors `name[rank]` that run on every proc of this region already (procs taken over
  // from a persistent worker: HostMesh::find_procs), now supervised by `owner` (as in
  // spawn_raw) through the actor layer's "adopt" (SV-5); returns at once. `initialized`
  // resolves once every proc confirmed its actor, or fails naming the first rank that has
  // none (or whose actor failed or stopped, with the cause).
  [[nodiscard]] Result<ActorMeshBase> adopt_raw(
      std::string name, std::optional<std::string> owner = std::string()) const;

  // How the proc at `rank` of this region ended ("killed by signal SIGKILL (9)"), if it has.
  std::optional<std::string> exit_status(size_t rank) const;
  int pid(size_t rank) const;

  // ME-15 (runtime.h): these procs, spawned by this process on attached hosts, belong to the
  // proc lineage[0] (an actor there asked for them; its Runtime::lineage()): handles on
  // them name those procs as their spawners, and this process stops them when one of those
  // stops and kills them when one fails.
  void spawned_for(const std::vector<std::string>& lineage) const;
  // Resolves once every proc of the whole mesh is known here to have ended (seen, or told
  // by another process: ME-7); a handle rebuilt here waits for the ends it hears of.
  actor::Future<void> ended() const;

  // Asks every proc of the whole mesh to exit; kills the ones still alive after `grace`.
  actor::Future<void> stop(std::chrono::milliseconds grace = std::chrono::seconds(5)) const;
  // stop(grace) once every future in `first` is ready, whatever its outcome, or once `wait`
  // has passed (ME-12): a ProcMesh stopped after its actor meshes' stop() futures.
  actor::Future<void> stop_after(std::vector<actor::Future<mesh::Replies>> first,
                                 std::chrono::milliseconds wait,
                                 std::chrono::milliseconds grace) const;

 private:
  // A mesh of actors `name` on this region: sends message(base rank, supervision id, this
  // process's key) to each proc's system actor; the answers complete `initialized`.
  [[nodiscard]] Result<ActorMeshBase> start_actors(
      std::string name, std::optional<std::string> owner,
      const std::function<std::vector<Buffer>(size_t, uint64_t, const std::string&)>& message)
      const;

  std::shared_ptr<mesh::ProcMeshState> st_;
  ndslice::Region region_;
};

class HostMesh {
 public:
  // This host, with no dimensions.
  HostMesh() = default;
  // The workers (host agents, "tcp://HOST:PORT") as a mesh {"hosts": N}; returns at once, and
  // initialized() says whether every one accepted (mesh::Runtime::attach). Needs a runtime
  // started on TCP (InitOptions::listen).
  [[nodiscard]] static Result<HostMesh> attach(const std::vector<std::string>& workers);

  // Spawns one proc per point of `per_host` (e.g. {{"gpus", 8}}) on each host of this mesh;
  // the ProcMesh's dimensions are the host mesh's, then per_host's.
  // `name`, on attached hosts, is how a later controller finds these procs when the workers
  // are persistent (find_procs).
  [[nodiscard]] Result<ProcMesh> spawn_procs(
      const std::vector<std::pair<std::string, size_t>>& per_host,
      const std::string& name = {}, const std::vector<mesh::ProcLaunch>& launches = {}) const;
  // The proc mesh `name` that this mesh's persistent workers kept after the controller that
  // spawned it left (mesh::Runtime::find_procs); this process owns it from now on.
  [[nodiscard]] Result<ProcMesh> find_procs(const std::string& name) const;

  // Attached hosts only (this_host() has nothing to wait for: ready at once).
  actor::Future<void> initialized() const;
  // Attached hosts only: ends this controller's use of the hosts in this mesh's region; their
  // procs are killed and count as stopped (mesh::Runtime::shutdown_hosts). Never fails once
  // started; kInvalidArgument for this_host().
  [[nodiscard]] Result<actor::Future<void>> shutdown() const;
  const ndslice::Region& region() const { return region_; }
  [[nodiscard]] Result<HostMesh> slice(std::string_view label, int64_t index) const;
  [[nodiscard]] Result<HostMesh> slice(std::string_view label, ndslice::Range range) const;
  HostMesh with_region(ndslice::Region region) const { return HostMesh(st_, std::move(region)); }
  // Every host of the attached mesh (all of them, whatever this handle's region), by rank;
  // empty for this_host().
  std::vector<mesh::HostInfo> hosts() const;

 private:
  HostMesh(std::shared_ptr<mesh::HostMeshState> st, ndslice::Region region)
      : st_(std::move(st)), region_(std::move(region)) {}
  std::shared_ptr<mesh::HostMeshState> st_;  // null: this host
  ndslice::Region region_;
};

// "tcp://HOST:PORT", "tcp:HOST:PORT" or "HOST:PORT" as a channel address.
[[nodiscard]] Result<channel::Address> parse_worker_address(std::string_view text);

// This host, as a mesh with no dimensions.
HostMesh this_host();
// The calling process's own proc, as a mesh with no dimensions.
ProcMesh this_proc();

}  // namespace podium
