// podium::mesh::MeshErrc — the mesh subsystem's error codes (Subsystem::kMesh).
//
// Before these, the runtime gave ActorErrc::kProcExited to every failure it made, so a
// protocol error or a worker's refusal reached Python as "the proc died". Now a code says
// which kind of failure it is. A proc that died (exited, killed, or ended with its lost
// host) is still actor::ActorErrc::kProcExited: that is the one "a proc died" code.
//
// Threads: constants only.
#pragma once

#include <cstdint>

#include "podium/base/error.h"

namespace podium::mesh {

enum class MeshErrc : uint16_t {
  // A host cannot be used: it did not answer the attach, its heartbeats stopped, or it was
  // shut down (HA-3, HA-4, HA-8).
  kHostLost = 100,
  // A worker refused: it serves another controller, or refused a spawn or lookup.
  kHostRefused = 101,
  // A peer sent a message this process cannot read (host_protocol.h): its reason names it.
  kProtocol = 102,
  // The runtime was shut down (or is shutting down): new work is refused.
  kShutDown = 103,
  // Procs could not be started (fork, exec, ports), or a host did not answer a spawn.
  kSpawnFailed = 104,
};
constexpr Subsystem subsystem_of(MeshErrc) { return Subsystem::kMesh; }

}  // namespace podium::mesh
