// podium::mesh::HostTable — the controller side of the host-agent protocol's state: the host
// meshes this controller attached, by id and by worker address, when each host was last heard
// from, and the requests (spawns, lookups, detaches) waiting for a worker's answer.
//
// The controller's protocol logic (attach, heartbeats and lost-host verdicts, spawn_procs and
// find_procs on hosts, shutdown_hosts, detach on exit) is Runtime::Impl's, in host_client.cc;
// the worker's is HostAgent's (host_agent.h, which states the protocol's invariants HA-1..).
//
// Threads: no thread and no lock of its own: Runtime::Impl::mu guards every member (the
// registry's lock, since a host's procs are looked up in the registry under the same lock).
// Lock order: Impl::mu -> HostMeshState::mu -> ProcMeshState::mu.
// Invariants:
//   HA-13 The host table holds what can still be used or answered: a host mesh whose every
//        host has failed (refused, unreachable, lost or shut down) leaves it, with its heard
//        clocks and its workers' entries, once it has been so for the grace period
//        (prune()); a request leaves it when answered or given up on. A controller that
//        attaches and shuts down host meshes for days does not grow.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "podium/actor/future.h"
#include "podium/mesh/runtime.h"

namespace podium::mesh {

struct HostTable {
  using Clock = std::chrono::steady_clock;

  struct HostRef {
    std::shared_ptr<HostMeshState> mesh;
    size_t index = 0;
  };
  // A worker's answer: the procs it spawned (host_spawned), or those of a proc mesh it keeps
  // (host_found: also the mesh's extent, its first rank here and how each ended).
  struct Answer {
    std::vector<std::string> keys;
    std::vector<int64_t> pids;
    std::string extent;              // host_found: ndslice codec bytes
    uint64_t first = 0;              // host_found
    std::vector<std::string> exits;  // host_found: "" while alive
  };

  std::unordered_map<uint64_t, std::shared_ptr<HostMeshState>> meshes;  // by id
  std::unordered_map<std::string, HostRef> by_worker;  // worker address text -> host
  uint64_t next_mesh = 1;
  // When each host was asked to attach, then last heard from.
  std::unordered_map<HostMeshState*, std::vector<Clock::time_point>> heard;
  // When each host mesh was first seen with every host failed (HA-13).
  std::unordered_map<uint64_t, Clock::time_point> done_since;
  std::unordered_map<uint64_t, std::shared_ptr<actor::Promise<Answer>>> requests;
  uint64_t next_request = 1;

  // Adds `hm` (its id set here) attached to `workers`, each heard from `now`.
  void add(const std::shared_ptr<HostMeshState>& hm,
           const std::vector<channel::Address>& workers, Clock::time_point now);
  // A request to a worker: its id, and the future its answer sets.
  std::pair<uint64_t, actor::Future<Answer>> new_request();
  // HA-13: drops the host meshes every host of which has failed for `grace`; returns how
  // many. Locks each HostMeshState::mu (after the caller's Impl::mu).
  size_t prune(Clock::time_point now, Clock::duration grace);
};

}  // namespace podium::mesh
