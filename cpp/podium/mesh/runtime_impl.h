// Internal to podium_mesh: Runtime::Impl, the services one process's runtime is made of and
// the state each role keeps. Its members are defined by role:
//   runtime.cc      wiring (make_runtime), the public accessors, shutdown in reverse order;
//   proc_table.cc   the procs this process spawned or heard of: readiness, ends (ME-2, ME-4,
//                   ME-7), kills and stops (ME-8), the dead records' sweep (ME-11);
//   host_client.cc  the controller side of the host-agent protocol (host_client.h);
//   bootstrap.cc    the process-wide runtime and the entry points (bootstrap.h).
// The worker side is a service of its own (HostAgent, host_agent.h), as are the spawner
// (proc_spawner.h), the output writer (host_output.h), the supervisor and the relay.
//
// Threads: handlers run on the root proc's loop threads; public Runtime calls on any thread.
// Every service pointer is set by make_runtime() before the runtime is published and never
// changes; the services stop in shutdown(), in the reverse order of their start.
// Locks, in the order they may be taken (never the other way):
//   Impl::mu -> HostMeshState::mu -> ProcMeshState::mu
// and leaf locks taken alone: HostAgent::mu_, ProcSpawner's and JobThread's, OutputWriter's,
// Supervisor's, Relay's. No message is sent to another process, and no proc spawned, while
// Impl::mu is held, except sends that only queue (Proc::send never blocks).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "podium/actor/proc.h"
#include "podium/base/clock_timer.h"
#include "podium/host/child_watcher.h"
#include "podium/mesh/cast.h"
#include "podium/mesh/host_agent.h"
#include "podium/mesh/host_client.h"
#include "podium/mesh/host_output.h"
#include "podium/mesh/proc_registry.h"
#include "podium/mesh/proc_spawner.h"
#include "podium/mesh/relay.h"
#include "podium/mesh/runtime.h"
#include "podium/supervision/supervisor.h"

namespace podium::mesh {

// What make_runtime() builds a runtime from.
// The gateway of a client attached through one (GW-3), for the procs it spawns on its host.
inline constexpr const char* kViaEnv = "PODIUM_VIA";

struct RuntimeConfig {
  channel::Address listen;
  std::optional<channel::Address> advertise;  // a worker's DIAL of DIAL@BIND (ProcConfig)
  int listen_fd = -1;                         // a worker's inherited socket (tcp://HOST:fdN)
  std::string worker_sock_dir;            // a Unix-socket worker's procs' socket directory
  std::string sock_dir;                   // a controller's socket directory; empty: none
  std::optional<channel::Address> parent;  // in a proc: its controller
  std::vector<std::string> lineage;        // in a proc: the procs it descends from (ME-15)
  bool reuse_port = false;                 // in a proc on a reserved port (HA-2)
  // In a local proc of a client attached through a gateway: its Net's Config::via (GW-3),
  // from kViaEnv; it listens on `listen` as any proc.
  std::optional<channel::Address> net_via;
  bool worker = false;                     // a host agent
  bool persistent = false;                 // a persistent host agent (HA-7)
  bool until_shutdown = false;             // a host agent that ends when its host is shut down
  InitOptions spawn;                       // how procs are started (proc_argv: absolute)
                                           // (spawn.via: a client attached through a gateway)
  std::function<void(actor::MeshFailure)> fault_handler;  // empty: the default (BT-2)
  // What every timer of the runtime and its root proc reads; null: spawn.clock, and when
  // that is null too the real clock (docs/host_agent.md, "Time").
  std::shared_ptr<base::Clock> clock;
};
[[nodiscard]] Result<std::unique_ptr<Runtime>> make_runtime(RuntimeConfig config);

// The default root handler of `impl`'s runtime (BT-2).
std::function<void(actor::MeshFailure)> default_root_handler(Runtime::Impl& impl);

struct Runtime::Impl : ProcRegistry {
  // ---- services: set by make_runtime(), then immutable (their own locks) ----
  std::unique_ptr<actor::Proc> proc;
  std::unique_ptr<host::ChildWatcher> watcher;
  std::unique_ptr<ProcSpawner> spawner;
  std::unique_ptr<OutputWriter> output;
  std::unique_ptr<Supervisor> supervisor;
  std::unique_ptr<Relay> relay;
  std::unique_ptr<HostAgent> agent;  // in a worker only
  Runtime* runtime = nullptr;  // the Runtime that owns this Impl (set by its constructor)
  std::string worker_sock_dir;  // a Unix-socket worker's procs' sockets; removed at shutdown
  std::string proc_key;  // proc->id().to_string()
  // ME-15: the keys of the procs this one descends from, nearest first (PODIUM_LINEAGE).
  std::vector<std::string> ancestors;
  std::optional<channel::Address> via;  // attached through this gateway (InitOptions::via)
  std::shared_ptr<base::Clock> clock;  // null: the real clock (CK-4)
  std::chrono::milliseconds host_lost_after{3000};   // PODIUM_HOST_LOST_MS
  std::chrono::milliseconds attach_timeout{10000};   // PODIUM_ATTACH_TIMEOUT_MS
  std::chrono::milliseconds dead_grace = dead_record_grace();  // ME-11

  // ---- BT-2: the fault-exit thread; fault_mu guards it ----
  std::mutex fault_mu;
  std::thread fault_exit;      // set once; joined by the first other shutdown() caller
  bool fault_joining = false;  // that caller has claimed the join
  void exit_on_fault();

  // ---- mu guards everything below, and the ProcRegistry base ----
  std::mutex mu;
  // The controller, in a proc: the one that spawned it, or the last to adopt it (HA-7).
  std::optional<channel::Address> parent;
  uint64_t next_mesh = 1;
  // Procs whose end is expected: their host was shut down (shutdown_hosts). Taken out when
  // the end is seen.
  std::unordered_set<std::string> released;
  // Procs whose end on_dying reported before their reap (DW-1); taken out by on_exit.
  std::unordered_set<std::string> ended_early;
  uint64_t dead_generation = 0;  // bumped whenever `dead` grows
  std::unique_ptr<base::Timer> sweep_timer;  // made by the first death
  bool sweep_armed = false;
  std::list<std::weak_ptr<Collector>> collectors;
  size_t tracks_since_prune = 0;
  std::shared_ptr<ProcMeshState> local_mesh;
  // ME-15: the meshes this controller spawned on attached hosts for another proc
  // (Runtime::spawned_for), by that proc's key; ended with it (end_spawned_for).
  std::unordered_map<std::string, std::vector<std::shared_ptr<ProcMeshState>>> spawned_for;
  // ME-15: why procs that end_spawned_for ended will have ended, by key; taken by proc_ended.
  std::unordered_map<std::string, std::string> end_reasons;
  // Where local procs' Unix sockets live: a controller's, made before it starts; in a proc,
  // made at its first local spawn (ME-14); removed at shutdown. Empty: none yet.
  std::string sock_dir;
  Result<std::string> socket_dir();  // sock_dir, made if need be; mu not held
  // shutdown(): `stopping` once a thread has begun it, `shut_down` once the hosts are
  // detached (new work is refused from then on), `stopped` when it has finished;
  // `stopped_cv` tells a concurrent caller, who must not return before then (ME-10).
  bool stopping = false;
  bool shut_down = false;
  bool stopped = false;
  std::condition_variable stopped_cv;
  // The controller side of attached hosts (host_client.h).
  HostTable hosts;
  std::unique_ptr<base::Timer> host_timer;  // started by the first attach
  base::SteadyTime next_beat{};  // when host_tick next sends the workers their heartbeats

  // ---- proc table (proc_table.cc) ----
  void on_ready(const actor::SystemHeader& h, const std::string& sender);
  void on_undeliverable(const wire::Envelope& env, const Error& why);
  void on_exit(const std::string& key, const host::ExitStatus& status);
  void on_dying(const std::string& key, const host::ExitStatus& status);
  void proc_ended(const std::string& key, int64_t pid, int32_t sig, int32_t code,
                  const std::string& how, const std::string& cause);
  bool proc_gone(const std::string& key, int64_t pid, int32_t sig, int32_t code,
                 const std::string& cause, bool expected);
  std::vector<channel::Address> exit_listeners(const std::string& key,
                                               const channel::Address* from);  // mu held
  void arm_sweep();  // mu held
  // ME-15: the proc `key` (pid `pid`) ended with `cause`: the procs of the views spawned by
  // it end too (recursively), and the meshes spawned for it are stopped or killed.
  void end_descendants(const std::string& key, int64_t pid, const std::string& cause,
                       bool expected, std::vector<std::shared_ptr<ProcMeshState>> views,
                       std::vector<std::shared_ptr<ProcMeshState>> tied);
  void end_spawned_for(const std::string& key, int64_t pid, const std::string& cause,
                       std::vector<std::shared_ptr<ProcMeshState>> tied, bool expected);
  void sweep_dead();
  void on_proc_exit(const actor::SystemHeader& h, const std::string& sender);
  void on_actor_failed(const actor::SystemHeader& h, wire::Envelope&& env);
  void on_kill(const actor::SystemHeader& h, const std::string& sender);
  void on_adopt(const actor::SystemHeader& h, const std::string& sender);
  void kill(const std::string& key);
  bool kill_any(const std::string& key, pid_t pid, int sig);
  // A malformed message with no request to answer: logged (rate-limited) with its reason.
  void malformed(const std::string& op, const std::string& sender, const Error& why);
  base::RateLimitedLog bad_messages;
  Error shut_down_error() const;

  // ---- host client (host_client.cc) ----
  void send_to(const channel::Address& to, actor::SystemHeader h);
  void kill_remote(const std::shared_ptr<HostMeshState>& host, size_t index,
                   const std::string& key, int sig);
  std::shared_ptr<HostMeshState> host_of(uint64_t mesh, uint64_t index);
  void on_host_attached(const actor::SystemHeader& h, const std::string& sender);
  void on_host_spawned(const actor::SystemHeader& h, const std::string& sender);
  void on_host_found(const actor::SystemHeader& h, const std::string& sender);
  void on_host_proc_exit(const actor::SystemHeader& h, const std::string& sender);
  void on_host_output(const actor::SystemHeader& h, const std::string& sender);
  void on_worker_beat(const actor::SystemHeader& h, const std::string& sender);
  std::shared_ptr<actor::Promise<HostTable::Answer>> take_request(uint64_t req);
  void forget_request(uint64_t req);
  void host_failed(const std::shared_ptr<HostMeshState>& hm, size_t index,
                   const std::string& why, MeshErrc code);
  void host_tick();
  base::SteadyTime now() const { return base::now_of(clock); }
  void release_worker(const channel::Address& worker);
  bool worker_undeliverable(const std::string& addr, const Error& why);
  void detach_hosts();

  // ---- lifecycle (runtime.cc) ----
  void shutdown();
};

}  // namespace podium::mesh
