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
//   BT-3 A proc spawns procs as its spawner does: every spawner (controller, host agent or
//        proc) puts its own proc and zygote commands in the PODIUM_SPAWN of each proc it
//        starts (SpawnCommands encodes them; decode(encode(c)) == c, and anything else is
//        refused naming the variable), and serve_proc() builds the proc's spawner from it,
//        then unsets it with PODIUM_BOOT. A proc without one spawns with this binary.
//   BT-5 A proc knows the procs it descends from (runtime ME-15): a proc that spawns procs on
//        its host puts its own key, then its own lineage, in their PODIUM_LINEAGE
//        (encode_lineage: each key as "<length>:<bytes>"; decode(encode(l)) == l, and
//        anything else is refused naming the variable); serve_proc() reads it and unsets it
//        with PODIUM_BOOT. A proc without one (a worker's, a controller's) descends from none.
//   BT-4 A proc told to exit ends as a program does, within a deadline: serve_proc() arms
//        a watchdog (PODIUM_PROC_EXIT_GRACE_MS, default kProcExitGrace, shorter than the
//        controller's kill grace), asks the procs it spawned to exit (ME-14), stops its
//        runtime (no runtime thread is left to call into the language runtime) and returns,
//        so the caller finalizes (Python: atexit handlers, module objects' __del__). If the
//        process has not reached exit() by the deadline, the watchdog ends it with _exit(3);
//        exit() stops and joins the watchdog first (a C atexit handler, which runs after
//        Python's finalization), so no thread is left unjoined.
#pragma once

#include <chrono>
#include <vector>

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

// BT-3: what a proc's own spawner starts procs with.
inline constexpr const char* kSpawnEnv = "PODIUM_SPAWN";
struct SpawnCommands {
  std::vector<std::string> proc_argv;    // argv[0] absolute
  std::vector<std::string> zygote_argv;  // empty: no zygote

  // "<n proc args>,<n zygote args>," then each argument as "<length>:<bytes>".
  std::string encode() const;
  [[nodiscard]] static Result<SpawnCommands> decode(std::string_view text);
  bool operator==(const SpawnCommands&) const = default;
};

// BT-5: the procs a proc descends from, nearest first.
inline constexpr const char* kLineageEnv = "PODIUM_LINEAGE";
std::string encode_lineage(const std::vector<std::string>& keys);
[[nodiscard]] Result<std::vector<std::string>> decode_lineage(std::string_view text);

// BT-4: how long a proc told to exit has to finish (PODIUM_PROC_EXIT_GRACE_MS), and how much
// of it the procs it spawned get to exit before they are killed.
inline constexpr std::chrono::milliseconds kProcExitGrace{3000};
std::chrono::milliseconds proc_exit_grace();

namespace internal {
// A directory only this user can open: $XDG_RUNTIME_DIR or /tmp, then
// podium-<uid>/<pid>-<rand> (a controller's, or a proc's once it spawns: ME-14).
[[nodiscard]] Result<std::string> make_socket_dir();
}  // namespace internal

}  // namespace podium::mesh
