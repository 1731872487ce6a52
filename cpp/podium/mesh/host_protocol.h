// podium::mesh host protocol — the typed messages between a controller, the host agents
// (workers) it attaches, and the procs it spawns (docs/host_agent.md, "Messages").
//
// Every message travels as an actor-layer system message (actor::SystemHeader: an op, string
// fields, integer fields) between root procs, and its sender is the sending proc's system
// actor (actor::system_message). Each message here is one struct with
//   encode() -> SystemHeader           what the sender builds, and
//   decode(SystemHeader) -> Result<T>  the one place the receiver reads it.
// decode() checks the op, the field counts, and every field a receiver relies on (addresses
// parse, an extent decodes, counts agree); it never throws.
//
// Threads: plain values and pure functions; any thread.
// Invariants:
//   HP-1 decode(encode(m)) == m for every message m, and decode() of anything that is not a
//        whole, well-formed message of its op fails with MeshErrc::kProtocol and a reason
//        naming the op and what is wrong ("host_spawn: expected 3 texts and 4 numbers, got
//        2 and 4"). A receiver answers such a message when it carries a request to answer,
//        and otherwise logs it (rate-limited, base::RateLimitedLog): none is dropped without
//        a word.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "podium/actor/message.h"
#include "podium/base/error.h"
#include "podium/channel/address.h"
#include "podium/ndslice/extent.h"

namespace podium::mesh::proto {

// A malformed message: MeshErrc::kProtocol, "OP: WHY".
[[nodiscard]] Error malformed(const std::string& op, const std::string& why);

// ---- controller -> worker ----

// Asks the worker to serve this controller (HA-1).
struct HostAttach {
  static constexpr const char* kOp = "host_attach";
  channel::Address controller;
  std::string advertise;  // the host name the controller dialled: procs listen there
  uint64_t host_mesh = 0, host_index = 0;
  uint64_t lost_after_ms = 0;  // HA-5; the worker clamps it (HA-9)
  actor::SystemHeader encode() const;
  static Result<HostAttach> decode(const actor::SystemHeader& h);
  bool operator==(const HostAttach&) const = default;
};

// Starts `count` procs, ranks [first, first + count) of the proc mesh `proc_mesh` (HA-2).
struct HostSpawn {
  static constexpr const char* kOp = "host_spawn";
  channel::Address controller;
  std::string name;        // "" if none (HA-7)
  ndslice::Extent extent;  // the whole mesh's
  uint64_t request = 0, proc_mesh = 0, first = 0, count = 0;
  // None, or one encoded ProcLaunch (launch.h) per proc, rank first + i.
  std::vector<std::string> launches;
  actor::SystemHeader encode() const;
  static Result<HostSpawn> decode(const actor::SystemHeader& h);
  bool operator==(const HostSpawn&) const = default;
};

// Kills a proc the worker started for this controller (ME-8's escalation on attached hosts).
struct HostKill {
  static constexpr const char* kOp = "host_kill";
  std::string proc_key;
  int32_t signal = 9;
  actor::SystemHeader encode() const;
  static Result<HostKill> decode(const actor::SystemHeader& h);
  bool operator==(const HostKill&) const = default;
};

// The controller leaves (stop false) or shut this host down (stop true, HA-8). Answered by
// a HostSpawned with no error and no procs.
struct HostDetach {
  static constexpr const char* kOp = "host_detach";
  channel::Address controller;
  uint64_t request = 0;
  bool stop = false;
  actor::SystemHeader encode() const;
  static Result<HostDetach> decode(const actor::SystemHeader& h);
  bool operator==(const HostDetach&) const = default;
};

// Takes over the proc mesh `name` that a persistent worker keeps (HA-7).
struct HostLookup {
  static constexpr const char* kOp = "host_lookup";
  channel::Address controller;
  std::string name;
  uint64_t request = 0;
  actor::SystemHeader encode() const;
  static Result<HostLookup> decode(const actor::SystemHeader& h);
  bool operator==(const HostLookup&) const = default;
};

// The controller's heartbeat (HA-5). The op "host_hb" goes both ways; a process reads the
// form of its role.
struct ControllerBeat {
  static constexpr const char* kOp = "host_hb";
  channel::Address controller;
  actor::SystemHeader encode() const;
  static Result<ControllerBeat> decode(const actor::SystemHeader& h);
  bool operator==(const ControllerBeat&) const = default;
};

// ---- worker -> controller ----

// The answer to HostAttach: accepted when `refusal` is empty.
struct HostAttached {
  static constexpr const char* kOp = "host_attached";
  std::string refusal;
  std::string hostname;
  uint64_t host_mesh = 0, host_index = 0;
  uint64_t worker_pid = 0;
  actor::SystemHeader encode() const;
  static Result<HostAttached> decode(const actor::SystemHeader& h);
  bool operator==(const HostAttached&) const = default;
};

// The answer to HostSpawn (and HostDetach): the procs started, or why none was.
struct HostSpawned {
  static constexpr const char* kOp = "host_spawned";
  uint64_t request = 0;
  std::string error;  // "" when done
  struct Proc {
    std::string key;  // its address
    int64_t pid = -1;
    bool operator==(const Proc&) const = default;
  };
  std::vector<Proc> procs;
  actor::SystemHeader encode() const;
  static Result<HostSpawned> decode(const actor::SystemHeader& h);
  bool operator==(const HostSpawned&) const = default;
};

// The answer to HostLookup: the part of the named mesh this worker keeps.
struct HostFound {
  static constexpr const char* kOp = "host_found";
  uint64_t request = 0;
  std::string error;             // "" when found
  std::string extent;            // the whole mesh's, ndslice codec bytes (as HostSpawn sent it)
  uint64_t first = 0;            // its first rank on this host
  struct Proc {
    std::string key;
    std::string exit;  // "" while alive, else how it ended
    int64_t pid = -1;
    bool operator==(const Proc&) const = default;
  };
  std::vector<Proc> procs;
  actor::SystemHeader encode() const;
  static Result<HostFound> decode(const actor::SystemHeader& h);
  bool operator==(const HostFound&) const = default;
};

// A proc the worker started for this controller ended.
struct HostProcExit {
  static constexpr const char* kOp = "host_proc_exit";
  std::string proc_key;
  uint64_t host_mesh = 0, host_index = 0;
  int64_t pid = -1;
  bool signaled = false;
  int32_t code = 0;  // exit status, or the signal
  actor::SystemHeader encode() const;
  static Result<HostProcExit> decode(const actor::SystemHeader& h);
  bool operator==(const HostProcExit&) const = default;
};

// The worker's heartbeat (HA-4).
struct WorkerBeat {
  static constexpr const char* kOp = "host_hb";
  uint64_t host_mesh = 0, host_index = 0;
  actor::SystemHeader encode() const;
  static Result<WorkerBeat> decode(const actor::SystemHeader& h);
  bool operator==(const WorkerBeat&) const = default;
};

// What the worker's procs wrote (HA-6).
struct HostOutput {
  static constexpr const char* kOp = "host_output";
  std::string data;
  int fd = 1;  // 1 stdout, 2 stderr
  actor::SystemHeader encode() const;
  static Result<HostOutput> decode(const actor::SystemHeader& h);
  bool operator==(const HostOutput&) const = default;
};

// ---- controller <-> its procs ----

// A proc is up (it listens): proc -> the controller that spawned it (ME-4).
struct Ready {
  static constexpr const char* kOp = "ready";
  std::string listen;
  uint64_t proc_mesh = 0, rank = 0, pid = 0;
  actor::SystemHeader encode() const;
  static Result<Ready> decode(const actor::SystemHeader& h);
  bool operator==(const Ready&) const = default;
};

// A proc ended: controller -> every other live proc (ME-7).
struct ProcExit {
  static constexpr const char* kOp = "proc_exit";
  std::string proc_key;
  std::string cause;
  int64_t pid = -1;
  bool expected = false;  // it was being stopped: no supervision event
  int32_t signal = 0;
  int32_t code = 0;
  actor::SystemHeader encode() const;
  static Result<ProcExit> decode(const actor::SystemHeader& h);
  bool operator==(const ProcExit&) const = default;
};

// A proc asks its controller to kill a proc whose actor did not stop.
struct KillRequest {
  static constexpr const char* kOp = "kill";
  std::string proc_key;
  actor::SystemHeader encode() const;
  static Result<KillRequest> decode(const actor::SystemHeader& h);
  bool operator==(const KillRequest&) const = default;
};

// A controller took this proc over (HA-7): requests for the controller go there.
struct AdoptProcs {
  static constexpr const char* kOp = "adopt_procs";
  channel::Address controller;
  actor::SystemHeader encode() const;
  static Result<AdoptProcs> decode(const actor::SystemHeader& h);
  bool operator==(const AdoptProcs&) const = default;
};

}  // namespace podium::mesh::proto
