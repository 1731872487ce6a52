// podium::mesh::ProcMeshRef / ActorMeshRef — a ProcMesh or ActorMesh handle as plain values,
// so that a handle can be sent to another process (pickled by Python, or encoded with
// encode()/decode_*() for a C++ message) and rebuilt there (ProcMesh::from_ref,
// ActorMeshBase::from_ref). Also the plain values that describe one rank of a mesh
// (RankInfo) and one host of a HostMesh (HostInfo).
//
//   mesh::ActorMeshRef ref = counters.ref();                  // in the spawning process
//   Buffer bytes = mesh::encode(ref);                          // ... sent elsewhere ...
//   auto again = ActorMeshBase::from_ref(*mesh::decode_actor_mesh_ref(bytes));
//
// Threads: plain values; the functions are thread-safe.
// Invariants:
//   MR-1 A handle rebuilt from a ref (in any process) addresses the same procs and actors over
//        the same region as the handle the ref was taken from; decode(encode(ref)) == ref.
//   MR-2 A ref names the host of every proc (this host's name spelled out where the proc runs
//        here), so that a handle rebuilt on another host still names the host each actor
//        runs on (supervision SV-4).
//   MR-3 from_ref checks what it is given: one proc (and one target) per rank of the root
//        extent, parseable addresses, a region inside the root; anything else is a
//        kInvalidArgument (or the parse error) naming what is wrong, never a handle that
//        indexes out of bounds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "podium/base/buffer.h"
#include "podium/base/error.h"
#include "podium/ndslice/region.h"

namespace podium::mesh {

// One proc of a mesh.
struct ProcRef {
  std::string id;    // its ProcId text (the channel address it listens on)
  int64_t pid = -1;
  std::string host;  // the host it runs on, never empty (MR-2)
  bool operator==(const ProcRef&) const = default;
};

struct ProcMeshRef {
  std::vector<std::string> labels;  // the root mesh's extent
  std::vector<size_t> sizes;
  std::vector<ProcRef> procs;       // by base rank of the root mesh
  ndslice::Region region;           // the handle's region of the root mesh
  std::vector<std::string> spawners;  // the procs they end with, nearest first (runtime ME-15)
  bool operator==(const ProcMeshRef&) const = default;
};

// Where one spawned actor is reached (mesh::ActorTarget without its host: the proc's).
struct ActorRef {
  std::string addr;      // its proc's channel address
  std::string dest;      // its mailbox PortId text
  std::string actor;     // its ActorId text
  std::string proc_key;  // its proc's key (the ProcId text)
  bool operator==(const ActorRef&) const = default;
};

struct ActorMeshRef {
  std::string name;
  ProcMeshRef procs;                          // its region: the actor mesh handle's
  std::vector<std::optional<ActorRef>> targets;  // by base rank; nullopt: no actor spawned there
  bool operator==(const ActorMeshRef&) const = default;
};

[[nodiscard]] Buffer encode(const ProcMeshRef& ref);
[[nodiscard]] Buffer encode(const ActorMeshRef& ref);
// Bytes from a peer: bounded decoding (wire WI-7); kInvalidArgument when malformed.
[[nodiscard]] Result<ProcMeshRef> decode_proc_mesh_ref(const Buffer& bytes);
[[nodiscard]] Result<ActorMeshRef> decode_actor_mesh_ref(const Buffer& bytes);

// One rank of an actor mesh's region, for error reports (Python's SupervisionError).
struct RankInfo {
  std::string actor;      // its ActorId text
  int64_t pid = -1;       // its proc's pid (-1: not known)
  std::string host;       // the host its proc runs on, never empty (SV-4)
  size_t base_rank = 0;   // its rank in the root ProcMesh
  std::string point;      // its coordinates in the root ProcMesh ("{'procs': 3/4}")
};

// One worker of an attached HostMesh.
struct HostInfo {
  std::string worker;                  // its address, as the controller dials it
  std::string hostname;                // once attached
  bool attached = false;
  std::optional<std::string> failure;  // why it is unusable, if it is
};

}  // namespace podium::mesh
