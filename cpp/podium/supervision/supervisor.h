// podium::supervision::Supervisor — the actor meshes this process owns, and the failures of their
// actors, raised once each to the mesh's owner.
//
// The owner of an actor mesh is the actor that spawned it, or, when no actor did (the
// controller's main program), the process's root: the root handler (the Python unhandled
// fault hook). Every process has one Supervisor (in its Runtime). A spawn registers the new
// mesh here and tells each actor where to report its failure (actor layer SV-1); the death of
// a proc reaches every process (the controller sees it through its pidfd or its zygote's
// report and tells the others, Runtime ME-7) and each Supervisor raises it for the meshes it owns with an actor there.
//
// Threads: every member is thread-safe. Events are dispatched outside the lock: to an owner
// actor's mailbox (a kSupervise message, handled in its turn), or to the root handler, which
// must not block.
// Invariants:
//   SV-2 One failure event per (mesh, rank): an actor failure and the later death of its proc
//        are one fault. Ranks of a mesh stopped by its owner, and procs that exit because their
//        ProcMesh is being stopped, raise nothing (a stop is not a failure).
//   SV-3 An event goes to the mesh's owner only: its actor's mailbox, else the root handler.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "podium/actor/mesh_failure.h"
#include "podium/actor/proc.h"
#include "podium/ndslice/extent.h"

namespace podium::supervision {

class Supervisor {
 public:
  using RootHandler = std::function<void(actor::MeshFailure)>;

  // An actor mesh spawned from this process. Failures name an actor by its rank and
  // coordinates in the ProcMesh, which are its rank in the ActorMesh when it was spawned on
  // the whole ProcMesh.
  struct Spawned {
    std::string name;
    std::string owner;  // ActorId text of the owning actor; empty: this process's root
    ndslice::Extent extent;           // the ProcMesh's (the root of the region spawned on)
    std::vector<size_t> base_ranks;   // per actor: its rank in the ProcMesh (its index)
    std::vector<std::string> proc_keys;
    std::vector<std::string> actor_ids;
    std::vector<int64_t> pids;
    std::vector<std::string> hosts;   // per actor: its host's name; empty: this host
  };

  explicit Supervisor(actor::Proc& proc) : proc_(proc) {}

  // Registers a mesh; the id goes into its spawn messages (SV-1).
  uint64_t add(Spawned mesh);
  // The owner stops these actors (by base rank): their failures are no faults.
  void stopping(uint64_t id, const std::vector<size_t>& base_ranks);
  // The actor of base rank `base_rank` of mesh `id` reported its failure ("actor_failed").
  void actor_failed(uint64_t id, uint64_t base_rank, actor::MeshFailure f);
  // A proc ended unexpectedly: every mesh owned here with an actor on it failed there.
  void proc_exited(const std::string& proc_key, int64_t pid, int32_t signal, int32_t exit_code,
                   const std::string& cause);
  void set_root_handler(RootHandler handler);
  // Whether a failure of the actor `actor_id` (ActorId text) was raised here, to its owner. A
  // proc's exit is raised before the calls waiting on it fail (Runtime's proc_gone), so a
  // caller that sees such a call fail knows whether its owner will hear of it (SV-7).
  bool raised(const std::string& actor_id);

 private:
  struct Entry {
    Spawned mesh;
    std::vector<uint8_t> done;  // per rank: failed (reported) or stopped
  };
  void dispatch(const std::string& owner, actor::MeshFailure f);

  actor::Proc& proc_;
  std::mutex mu_;  // guards everything below
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Entry> meshes_;
  std::unordered_set<std::string> raised_;  // actor ids whose failure was raised (SV-7)
  RootHandler root_;
};

}  // namespace podium::supervision

namespace podium::mesh {
// The mesh layer names it as its own: every Runtime has one (runtime.h).
using supervision::Supervisor;
}  // namespace podium::mesh
