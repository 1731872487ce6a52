// Internal to podium_mesh: how a process becomes a podium process. The public entry points
// (podium::init, init_controller, serve_proc, serve_worker, shutdown; runtime.h) live in
// bootstrap.cc with the process-wide runtime they create; this header holds what the
// spawning side and the spawned side share: the PODIUM_BOOT line, as one struct.
//
// Threads: Boot is a plain value. The process-wide runtime (bootstrap.cc) is created once
// under g_mu and read without it afterwards (an atomic pointer).
// Invariants:
//   BT-1 A spawned proc learns everything it needs from PODIUM_BOOT, which one Boot
//        encodes and decodes: decode(encode(b)) == b, and a line that is not exactly that
//        (4 or 5 ';'-separated fields, addresses that parse, numbers) is refused naming the
//        line and what is wrong. The proc unsets PODIUM_BOOT before serving, so programs its
//        actors start are not procs.
//   BT-2 An unhandled fault ends the process in one place: the default root handler hands
//        it to the runtime's fault-exit thread (joinable, never detached), which shuts the
//        runtime down and then ends the process with status 1 (_exit: no static destructor
//        runs under threads still alive). No exit() runs on a runtime thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "podium/base/error.h"
#include "podium/channel/address.h"

namespace podium::mesh {

inline constexpr const char* kBootEnv = "PODIUM_BOOT";

// "<parent proc addr>;<listen addr>;<mesh id>;<rank>[;reuse_port]"
struct Boot {
  channel::Address parent;  // the controller to register with ("ready")
  channel::Address listen;  // where this proc listens: its ProcId
  uint64_t mesh_id = 0, rank = 0;
  bool reuse_port = false;  // its port is reserved by its spawner (HA-2)

  std::string encode() const;
  [[nodiscard]] static Result<Boot> decode(std::string_view line);
  bool operator==(const Boot&) const = default;
};

}  // namespace podium::mesh
