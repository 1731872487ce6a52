// podium::actor::MeshFailure — what the owner of a mesh learns when one of its actors fails.
//
// A failure event names the mesh and the actor, the actor's rank and coordinates in the region
// the mesh was spawned on, the host and pid of its proc, and the cause. It travels as part 0
// of a kSupervise message to the owner's mailbox (message.h), and as the payload of the
// "actor_failed" system message from the failed actor's proc to its owner's process.
// The supervision model (who owns what, when events are raised) is in docs/supervision.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "podium/base/buffer.h"
#include "podium/base/error.h"

namespace podium::actor {

struct MeshFailure {
  enum class Kind : uint8_t {
    kActor = 0,  // the actor failed; its proc lives on
    kProc = 1,   // the proc hosting the actor ended (signal or exit status)
  };
  Kind kind = Kind::kActor;
  std::string mesh_name;  // the actor mesh (the name given to spawn)
  std::string actor_id;   // the failed actor, ActorId text
  uint64_t rank = 0;      // the actor's rank in its ProcMesh (= its index)
  std::string point;      // that rank's coordinates, "{'gpus': 1/2}"
  std::string host;       // of the failed actor's proc
  int64_t pid = -1;       // of the failed actor's proc
  int32_t signal = 0;     // kProc: the signal that killed the proc, else 0
  int32_t exit_code = -1; // kProc: the proc's exit status when it exited, else -1
  std::string cause;      // the exception and its traceback, the exit status, or a child's report

  // "actor counter[1] of mesh 'counter' (rank 1 {'gpus': 1/2}, host h, pid 42) failed: <cause>"
  // (the actor by its local key; actor_id has the full ActorId).
  std::string report() const;
};

[[nodiscard]] Buffer encode_mesh_failure(const MeshFailure& f);
[[nodiscard]] Result<MeshFailure> decode_mesh_failure(const Buffer& b);

// This host's name, for failure reports.
const std::string& host_name();

// The short name of a signal ("SIGKILL"), or "signal N".
std::string signal_name(int sig);

}  // namespace podium::actor
