// podium::mesh::ProcRegistry — what a Runtime remembers of the procs it has heard of: the mesh
// and rank of each proc it spawned or adopted, how each proc it saw end (or was told of, ME-7)
// ended, the TCP port held for each local proc, and the meshes built here from another
// process's state (views). And when it forgets them: a controller that spawns and stops meshes
// for days must not grow with every proc it ever had.
//
// Threads: no thread of its own and no lock of its own; the Runtime guards every member with
// its mutex (Runtime::Impl::mu) and passes the time in, so that tests drive it on virtual time.
// Invariants:
//   ME-11 A dead proc's records (its `dead` reason, its `by_key` entry, its port reservation,
//        its view entries; the Runtime then drops its key from its host's proc_keys and its
//        AC-11 send counters, Proc::forget_dests) are kept while anything in this process can
//        still address it: a ProcMeshState that holds it is alive (a ProcMesh or ActorMesh
//        handle of the mesh it was spawned or adopted in, or a view: a handle rebuilt here
//        from another process's state, watch()). So a call to it fails at once with its exact
//        reason (ME-2). They are dropped at the first sweep after the proc has been dead for
//        `grace` (kDeadRecordGrace, PODIUM_DEAD_RECORD_GRACE_MS) with no such state alive; a
//        record still addressed then waits another `grace`. Expired mesh and view entries go
//        in the same sweeps (views also when their count doubles). Each dead proc costs O(1)
//        amortised, and the tables hold what is addressable plus what died in the last
//        `grace`: flat over any number of spawn/stop cycles.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "podium/base/error.h"
#include "podium/channel/net.h"
#include "podium/mesh/runtime.h"

namespace podium::mesh {

// How long a dead proc's record outlives the last handle that addresses it (ME-11).
inline constexpr std::chrono::seconds kDeadRecordGrace{30};
// kDeadRecordGrace, or PODIUM_DEAD_RECORD_GRACE_MS when set (tests, the soak benchmark).
std::chrono::milliseconds dead_record_grace();

struct ProcRegistry {
  using Clock = std::chrono::steady_clock;

  struct ProcRef {
    std::weak_ptr<ProcMeshState> mesh;
    size_t rank;
    std::shared_ptr<HostMeshState> host;  // set for a proc on an attached host
    size_t host_index = 0;
  };
  // A proc whose records a sweep dropped: the Runtime drops what it keeps elsewhere.
  struct Dropped {
    std::string key;
    std::shared_ptr<HostMeshState> host;  // its host's proc_keys hold `key`
    size_t host_index = 0;
  };

  std::unordered_map<uint64_t, std::weak_ptr<ProcMeshState>> meshes;  // spawned/adopted, by id
  std::unordered_map<std::string, ProcRef> by_key;  // proc addr text -> mesh, rank
  std::unordered_map<std::string, Error> dead;      // proc addr text -> why
  // TCP ports held for local procs until they exit (PortReservation), by proc key.
  std::unordered_map<std::string, channel::PortReservation> reservations;

  // Records that the proc `key` ended with `why`; false when it was known dead already.
  bool note_dead(const std::string& key, Error why, Clock::time_point now);
  // A handle rebuilt here from another process's state addresses the procs of `mesh` (ME-11).
  void add_view(const std::shared_ptr<ProcMeshState>& mesh);
  // ME-15: the live views (add_view) of procs that descend from the proc `key`.
  std::vector<std::shared_ptr<ProcMeshState>> views_spawned_by(const std::string& key) const;
  // Whether a live ProcMeshState of this process holds the proc `key`.
  bool addressed(const std::string& key) const;
  // ME-11: drops the records of procs dead for `grace` that nothing addresses.
  std::vector<Dropped> sweep(Clock::time_point now, Clock::duration grace);
  // When the next sweep has something to look at; nullopt: no dead record waits.
  std::optional<Clock::time_point> next_sweep(Clock::duration grace) const;

  size_t waiting() const { return dying_.size(); }  // dead records not yet dropped (tests)
  size_t view_count() const { return view_count_; }  // (tests)

 private:
  void compact_views();

  std::deque<std::pair<Clock::time_point, std::string>> dying_;  // dead keys, oldest first
  std::unordered_map<std::string, std::vector<std::weak_ptr<ProcMeshState>>> views_;
  // The views by each of their spawners (ProcMeshState::spawners; ME-15), compacted with
  // views_.
  std::unordered_map<std::string, std::vector<std::weak_ptr<ProcMeshState>>> by_spawner_;
  size_t view_count_ = 0;          // weak pointers in views_
  size_t views_after_compact_ = 0;
};

}  // namespace podium::mesh
