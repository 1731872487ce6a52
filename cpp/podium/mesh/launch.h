// podium::mesh::ProcLaunch — how one proc is started when its spawner is told more than the
// default (HostMesh.spawn_procs(bootstrap_command=..., proc_bind=...),
// HostMesh.with_python_executable): the command that starts it, variables for its
// environment, and the CPUs / NUMA memory it is bound to.
//
// A launch travels as one opaque string per proc (encode/decode, msgpack) from the
// controller to the spawner that starts the proc: this process's for local procs, a
// worker's (HostSpawn, host_protocol.h) for attached hosts. The binding is resolved on the
// proc's own host (a NUMA node's CPUs are that host's): the spawner hands it to the proc in
// PODIUM_PROC_BIND, and the proc applies it first thing at boot (apply_bind, called by
// serve_proc before any runtime thread starts), so every thread it starts inherits it.
//
// Threads: plain values and free functions; apply_bind changes the calling process.
// Invariants:
//   LA-1 A proc started with a binding runs bound or does not run: apply_bind binds every
//        thread of the process (sched_setaffinity) and, for membind, the memory policy
//        (set_mempolicy MPOL_BIND), and any key, CPU list or node it cannot apply is an
//        error naming the key and the value, which ends the proc before it registers (its
//        mesh's `initialized` fails naming it). Keys: cpus, physcpubind (CPU lists such as
//        "0-3,8"), cpunodebind (NUMA nodes, whose CPUs /sys lists), membind (NUMA nodes).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "podium/base/error.h"

namespace podium::mesh {

inline constexpr const char* kBindEnv = "PODIUM_PROC_BIND";

struct ProcLaunch {
  // The program and its argv (argv[0] included); empty: the spawner's default command.
  std::string program;
  std::vector<std::string> argv;
  // Set in the proc's environment (after PODIUM_BOOT is), and removed from it.
  std::vector<std::pair<std::string, std::string>> env;
  std::vector<std::string> unset;
  bool inherit_env = true;  // false: the proc starts from an empty environment
  // (key, value) pairs (LA-1); empty: not bound.
  std::vector<std::pair<std::string, std::string>> bind;

  bool empty() const { return program.empty() && env.empty() && unset.empty() && inherit_env &&
                              bind.empty(); }
  std::string encode() const;
  [[nodiscard]] static Result<ProcLaunch> decode(std::string_view bytes);
  bool operator==(const ProcLaunch&) const = default;
};

// The bind pairs as PODIUM_PROC_BIND's value ("key=value;key=value") and back.
std::string encode_bind(const std::vector<std::pair<std::string, std::string>>& bind);
[[nodiscard]] Result<std::vector<std::pair<std::string, std::string>>> decode_bind(
    std::string_view text);
// A CPU or node list ("0-3,8") as numbers; an error naming `text` when it is not one.
[[nodiscard]] Result<std::vector<int>> parse_cpu_list(std::string_view text);
// LA-1: binds this process as `text` (PODIUM_PROC_BIND's value) says.
[[nodiscard]] Result<void> apply_bind(std::string_view text);

}  // namespace podium::mesh
