// podium::mesh::Runtime — the per-process podium runtime: the root Proc and the procs it has
// spawned on this host.
//
// A program calls podium::init(argc, argv) first. In a controller it creates the runtime and
// returns. In a proc that the runtime spawned (its own binary re-entered, recognised by the
// PODIUM_BOOT environment variable) it serves actors until the controller says "exit" or dies,
// and never returns.
//
// Procs are spawned with die-with-parent (PR_SET_PDEATHSIG) in their own process group, watched
// through pidfds (an exit is seen at once and reported with its status), and killed at
// shutdown. Their Unix sockets live in a per-controller directory of mode 0700.
//
// Layout: this header is the runtime's public face; runtime_impl.h says which file holds
// which role (boot: bootstrap.h; spawning: proc_spawner.h; the host agent: host_agent.h; the
// controller's side of it: host_client.h; the typed messages: host_protocol.h).
//
// Threads: every member is thread-safe.
// Locks, in the order they may be taken: Runtime::Impl::mu -> HostMeshState::mu ->
// ProcMeshState::mu (the others are leaves; runtime_impl.h).
// Invariants:
//   ME-3 Every proc spawned is reaped; shutdown() kills and reaps the ones still alive.
//   ME-4 A ProcMesh's `initialized` resolves once: ok when every proc registered, or the first
//        proc exit / spawn failure, naming the rank, pid and status.
//   ME-7 The controller tells every live proc it spawned of each proc exit it observes
//        ("proc_exit"), so calls from any process to a dead proc fail at once (ME-2 holds in
//        procs too) and each process's Supervisor raises the failure for the meshes it owns.
//   ME-10 shutdown() returns only once the runtime's services have stopped, to every caller:
//        one called while another thread's is under way waits for it (bounded), so no
//        caller goes on to exit() and its static destructors while threads are still joined.
//   ME-14 A proc spawns procs as a controller does (BT-3): it makes its own socket directory
//        (mode 0700) at its first local spawn and removes it at its shutdown; the procs it
//        spawns register with it, are watched, reaped and killed by it (ME-3) and die with it
//        (PR_SET_PDEATHSIG: a controller's death ends every level), and their failures reach
//        the owners of the meshes on them in this proc (SV-2). Ends travel the whole tree
//        (ME-7 upward too): a process tells its spawner and its live procs of each end it
//        sees, and passes on, once, each it hears of, so a call from any process to a dead
//        proc of another level fails at once. A proc told to exit first
//        stops the procs it spawned (stop_spawned: "exit", then SIGKILL after half its exit
//        grace, BT-4), so stopping a mesh stops its procs' procs, recursively.
//   ME-15 The procs of a mesh end with the procs they descend from (ProcMeshState::spawners:
//        their spawner, its spawner, ...), and every process that holds a handle on them
//        learns of it at once: when a process learns that a proc ended (seen, or told: ME-7,
//        ME-14), every handle it holds on procs descending from it (a view, watch()) counts
//        those procs as ended too, with the cause "ended with the proc that spawned it
//        (pid, key), which <how that one ended>" (or "with a proc it descends from"), as
//        SIGKILL (PR_SET_PDEATHSIG ends them so), so calls in flight and later calls to them
//        fail at once, not at their delivery timeout, and the meshes owned there with actors
//        on them raise the failure (SV-2). This process's own procs and itself are left to
//        their own ends. Procs that a controller spawned on attached hosts for another proc
//        (spawned_for) are stopped by the controller when that proc (or one it descends
//        from) stops ("exit", then SIGKILL after a grace period) and killed when it fails,
//        as a local spawner's procs are.
//   ME-11 (see proc_registry.h) a dead proc's records are kept while this process can
//        address it and dropped after a grace period (30 s, PODIUM_DEAD_RECORD_GRACE_MS).
#pragma once

#include <atomic>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <functional>
#include <mutex>

#include "podium/actor/future.h"
#include "podium/actor/mesh_failure.h"
#include "podium/actor/proc.h"
#include "podium/base/clock.h"
#include "podium/mesh/launch.h"
#include "podium/ndslice/extent.h"

namespace podium {

// Starts podium in this process. In a spawned proc: serves, then exits the process.
void init(int argc, char** argv);

// For embedders (the Python extension) that start procs with another command.
struct InitOptions {
  // The command that starts a proc (argv[0] is the executable); it must call serve_proc().
  // Empty: this binary, re-entered with the same arguments.
  std::vector<std::string> proc_argv;
  // When set, procs are forked from a zygote (host/zygote.h) started with this command (it
  // must call host::zygote_serve on fd 3, then serve_proc() in each child), with proc_argv
  // as their argv. A zygote that cannot start is logged, and procs are exec'd as without.
  std::vector<std::string> zygote_argv;
  // Where this process's root proc listens. Unset: a Unix socket in a private directory, and
  // procs on Unix sockets too. A TCP address ("tcp:10.0.0.1:0"; port 0 picks one) makes the
  // whole job use TCP: this process, the procs it spawns, and procs on attached hosts
  // (enable_transport("tcp")). Needed to attach workers on other hosts.
  std::optional<channel::Address> listen;
  // attach(addr), as Monarch's: this controller reaches everything through the gateway (a
  // worker) at `via`, which routes the procs' traffic back over the one duplex this process
  // dialled (channel GW-1..GW-4): it listens nowhere, its address is the routed one, and the
  // job is on TCP. `listen` is then unused.
  std::optional<channel::Address> via;
  // The time the runtime's timers read (heartbeats, lost-host and attach verdicts, the dead
  // records' sweep, stop and shutdown bounds) and its root proc's (ProcConfig::clock). Null:
  // the real clock. Tests pass a base::ManualClock (docs/host_agent.md, "Time").
  std::shared_ptr<base::Clock> clock;
};

// The address of this machine that other hosts most likely reach it by: PODIUM_HOST_ADDR when
// set, else the source address of the route to a public address (no packet is sent), else the
// host name's address, else 127.0.0.1.
std::string default_host_address();

// A host agent (python -m podium worker): serves one controller at a time, spawning procs for
// it on this host, reporting their exits, and exchanging heartbeats (docs/host_agent.md).
struct WorkerOptions {
  channel::Address listen;  // TCP (port 0 picks one) or a Unix socket (ipc://PATH)
  // DIAL of DIAL@BIND: the address controllers dial, and this worker's identity, while it
  // listens on `listen` (channel/address.h, CH-24); unset: `listen` itself.
  std::optional<channel::Address> advertise;
  int listen_fd = -1;  // >= 0: accept on this inherited listening socket (tcp://HOST:fdN)
  InitOptions procs;        // how procs are started (proc_argv, zygote_argv)
  // Keep procs (and their actors) when the controller leaves or goes silent, for a later
  // controller to take over by name (Runtime::find_procs; docs/host_agent.md HA-7).
  bool persistent = false;
  // Accept controllers that hold no secret (SE-2, docs/security.md): without a secret in the
  // environment, a worker refuses to start unless this is set, and says so on stderr if it is.
  bool insecure = false;
  // Return once a controller shuts this host down (HostMesh.shutdown), instead of serving
  // the next controller (run_worker_loop_until_shutdown).
  bool until_shutdown = false;
  // Called once the worker listens, with the bound address.
  std::function<void(const channel::Address&)> on_listening;
};
// Runs this process as a host agent until it is killed (or fails to start: the error).
[[nodiscard]] Status serve_worker(WorkerOptions options);
// Starts the controller runtime; a second call does nothing.
[[nodiscard]] Status init_controller(InitOptions options);
// True in a process that a podium runtime spawned as a proc (PODIUM_BOOT is set).
bool is_proc();
// Runs this proc's runtime: registers with the controller, serves actors until the
// controller says "exit" (or dies: PR_SET_PDEATHSIG), then stops the runtime and returns.
[[nodiscard]] Status serve_proc();
// Stops every proc this process spawned and the root proc. Idempotent; also run at exit.
void shutdown();
// Where failures of meshes owned by this process's root go (supervisor.h, SV-3), for this
// process's runtime whether it runs yet or starts later. The default logs the report and ends
// the process with status 1. The handler runs on a runtime thread and must not block.
void set_unhandled_fault_handler(std::function<void(actor::MeshFailure)> handler);

namespace supervision {
class Supervisor;
}

namespace mesh {

class Collector;
class Relay;
using supervision::Supervisor;

struct HostMeshState;

struct ProcInfo {
  actor::ProcId id;
  int pid = -1;
  bool ready = false;
  std::optional<std::string> exit;  // how it ended, once it has
  std::string host;                 // the host name it runs on; empty: this host
};

// The procs of one spawn_procs() call, by base rank. Shared by every slice of the mesh.
struct ProcMeshState {
  uint64_t mesh_id = 0;
  ndslice::Extent extent;
  std::mutex mu;                     // guards procs[*].ready/exit/pid, ready_count, stopping
  std::vector<ProcInfo> procs;       // size and ids set before the state is published
  size_t ready_count = 0;
  bool stopping = false;
  actor::Promise<void> initialized_promise;
  actor::Future<void> initialized;
  bool local = false;                // the root proc itself (this_proc())
  // ME-15: the keys of the procs these procs end with, nearest first: the process that
  // spawned them on its host (PR_SET_PDEATHSIG), or the proc they were spawned for on
  // attached hosts (Runtime::spawned_for: the controller ends them when that proc ends),
  // then that one's own spawners (its PODIUM_LINEAGE). Empty: none (a persistent worker's
  // procs outlive their controller). Set before the state is published, or by
  // Runtime::spawned_for under `mu`; a handle rebuilt elsewhere carries them
  // (ProcMeshRef::spawners).
  std::vector<std::string> spawners;
};

// One worker of an attached HostMesh (docs/host_agent.md).
struct HostState {
  channel::Address worker;              // as the controller dials it
  std::string hostname;                 // once attached
  bool attached = false;
  std::optional<std::string> failure;   // why it is unusable: refused, unreachable, lost or
                                        // shut down
  std::vector<std::string> proc_keys;   // procs spawned on it
};

// The hosts of one attach() call, by rank ({"hosts": N}).
struct HostMeshState {
  uint64_t id = 0;
  std::mutex mu;  // guards hosts[*] (but `worker`), attached_count
  std::vector<HostState> hosts;
  size_t attached_count = 0;
  actor::Promise<void> initialized_promise;
  actor::Future<void> initialized;  // every worker attached, or the first failure
};

class Runtime {
 public:
  static Runtime& get();  // after podium::init()
  static Runtime* current();  // the runtime, or nullptr before podium::init()

  actor::Proc& proc();
  // proc().id().to_string(), cached.
  const std::string& proc_key() const;

  // Spawns one proc per rank of `extent` on this host; returns at once.
  // `launches`: empty, or one per rank (launch.h: its command, environment, binding).
  [[nodiscard]] Result<std::shared_ptr<ProcMeshState>> spawn_procs(
      const ndslice::Extent& extent, const std::vector<ProcLaunch>& launches = {});
  // Attaches the workers (host agents) at `workers`; returns at once. `initialized` resolves
  // once every worker accepted this controller, or fails naming the first that refused or did
  // not answer within the attach timeout (PODIUM_ATTACH_TIMEOUT_MS, default 10000). From
  // then on heartbeats watch each host: one silent for PODIUM_HOST_LOST_MS (default 3000)
  // is lost, and its procs fail as if they had exited. Needs a TCP listen address.
  [[nodiscard]] Result<std::shared_ptr<HostMeshState>> attach(
      std::vector<channel::Address> workers);
  // Spawns `per_host` procs on each host of `hosts` named by `host_ranks`, in that order:
  // the procs of host_ranks[i] are ranks [i * per_host, (i + 1) * per_host) of `extent`.
  // Waits for the hosts to attach and to answer (bounded by the attach timeout); the procs
  // start in the background, and `initialized` resolves when all have registered.
  // A `name` (may be empty) is how a later controller finds the procs on a persistent worker.
  [[nodiscard]] Result<std::shared_ptr<ProcMeshState>> spawn_procs(
      const std::shared_ptr<HostMeshState>& hosts, const std::vector<size_t>& host_ranks,
      const ndslice::Extent& extent, const std::string& name = {},
      const std::vector<ProcLaunch>& launches = {});
  // Takes over the proc mesh `name` that the workers of `hosts` named by `host_ranks` keep
  // (a persistent worker keeps its procs after their controller left; docs/host_agent.md
  // HA-7): their parts must fit one extent, and from now on this process watches those procs
  // as if it had spawned them. Procs that ended meanwhile count as exited (`initialized`
  // fails naming the first). Bounded by the attach timeout.
  [[nodiscard]] Result<std::shared_ptr<ProcMeshState>> find_procs(
      const std::shared_ptr<HostMeshState>& hosts, const std::vector<size_t>& host_ranks,
      const std::string& name);
  // The root proc as a mesh with no dimensions.
  std::shared_ptr<ProcMeshState> this_proc();
  // ME-15: the procs of `mesh` (spawned here, on attached hosts) belong to the proc
  // lineage[0] (an actor there asked for them; then the procs it descends from, its
  // lineage()): their handles name them as their spawners, and this process stops them when
  // one of those stops and kills them when one fails (at once if one has ended already).
  // Call before any handle of `mesh` leaves this process.
  void spawned_for(const std::shared_ptr<ProcMeshState>& mesh,
                   const std::vector<std::string>& lineage);
  // ME-15: this process's key, then the keys of the procs it descends from (its spawner,
  // that one's, ...: PODIUM_LINEAGE); just its key in a controller or worker.
  std::vector<std::string> lineage() const;
  // Resolves once every proc of `mesh` is known here to have ended (seen, or told: ME-7).
  actor::Future<void> procs_ended(const std::shared_ptr<ProcMeshState>& mesh);
  // Ends this controller's use of the hosts of `hosts` named by `host_ranks`
  // (HostMesh.shutdown, docs/host_agent.md HA-8): each worker kills the procs it runs for this
  // controller (a persistent one too) and serves no controller until one attaches again. The
  // procs count as stopped: their ends raise no supervision event, and calls to them fail
  // naming the shutdown. The hosts are watched no more, and spawn_procs on them fails.
  // Resolves once every worker answered, or after the attach timeout (each worker that did
  // not answer is named in a warning); never fails.
  actor::Future<void> shutdown_hosts(const std::shared_ptr<HostMeshState>& hosts,
                                     const std::vector<size_t>& host_ranks);
  // Asks each proc to exit; kills those still alive after `grace`. Resolves when all are gone.
  actor::Future<void> stop_procs(const std::shared_ptr<ProcMeshState>& mesh,
                                 std::chrono::milliseconds grace);

  // ME-14: asks every proc this process spawned (every mesh of spawn_procs still alive) to
  // exit, and waits until they have or `grace` has passed (those left are killed after it).
  void stop_spawned(std::chrono::milliseconds grace);

  // ME-2: the collector learns of exits of the procs it waits on. Procs that exited before
  // are looked up in the dead set, unless `clean` says that none of `proc_keys` was dead the
  // last time, and none has died since (a cast's CastTargets keeps it: O(1) per call).
  void track(const std::shared_ptr<Collector>& collector,
             const std::vector<std::string>& proc_keys, std::atomic<uint64_t>* clean = nullptr);

  // Why the proc `proc_key` is gone, if this process has seen it exit (or been told: ME-7).
  std::optional<Error> proc_dead(const std::string& proc_key);
  // `mesh` was rebuilt here from another process's state (a ProcMesh or ActorMesh handle
  // passed to this process): the records of its procs' ends stay while it lives (ME-11).
  void watch(const std::shared_ptr<ProcMeshState>& mesh);
  // This process's cast relay (relay.h).
  Relay& relay();

  // The meshes this process owns and their failures (supervisor.h).
  Supervisor& supervisor();
  // Kills the proc `proc_key` (SIGKILL to its process group): here if this process spawned
  // it, else by asking the controller. For stops that escalate.
  void kill_proc(const std::string& proc_key);

  void shutdown();

  struct Impl;  // runtime_impl.h: the services and the state of each role
  explicit Runtime(std::unique_ptr<Impl> impl);
  ~Runtime();
  Impl& impl() { return *impl_; }  // for podium_mesh's own files

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mesh
}  // namespace podium
