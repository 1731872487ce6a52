// podium::mesh::HostAgent — the worker side of the host-agent protocol (docs/host_agent.md):
// a `python -m podium worker` serves one controller at a time, spawning procs for it on this
// host, reporting their exits, forwarding what they print, trading heartbeats, and (when
// persistent) keeping its procs for a later controller. The controller side is the
// runtime's host client (host_client.cc); the messages are typed in host_protocol.h.
//
// Threads: handlers run on the root proc's loop threads and must not block; a host_spawn is
// carried out on the agent's own spawn thread (a JobThread, joined by stop()), since starting
// the zygote waits for the loop. Every public member is thread-safe.
// Locks: mu_ guards every field of State. Lock order: HostAgent::mu_ is a leaf (nothing else
// is locked under it; no message is sent and no proc spawned under it).
// Invariants (the protocol's, both sides; the controller keeps HA-3, HA-4, HA-8 and HA-10):
//   HA-1 One controller. A worker serves the controller that attached it until that one
//        detaches, shuts the host down (HA-8) or goes silent; another controller's
//        host_attach is refused with a message naming the one served ("worker tcp:... on host
//        h serves another controller (tcp:...)"). Within a controller a worker belongs to one
//        host mesh at a time: attaching it again is refused ("is attached already") until that
//        mesh can no longer use it (refused, unreachable, lost or shut down).
//   HA-2 Addresses before procs. A proc's address is known when spawn_procs returns, as on
//        one host: the worker reserves a TCP port per proc (channel::PortReservation, bound
//        with SO_REUSEPORT, never listening), answers host_spawned with the addresses, and the
//        proc, told reuse_port in its boot line, listens on it. The reservation is dropped when
//        the proc exits. A controller on TCP does the same for its local procs.
//   HA-3 Bounded attach. HostMesh.initialized resolves once every worker accepted, or fails
//        with the first refusal (a wrong or missing secret comes back as the channel's
//        kAuthFailed at once) or once PODIUM_ATTACH_TIMEOUT_MS (default 10 s) of silence has
//        passed (timed to that deadline): "cannot attach host 1 (tcp:10.0.0.2:7000): no
//        answer within 10.0 s (unreachable, or not a podium worker)". spawn_procs on hosts waits for attach and for the workers'
//        answers within the same bound.
//   HA-4 Lost hosts. The controller hears from each attached worker every lost-after / 6. A
//        host not heard from for PODIUM_HOST_LOST_MS (default 3000) is lost: each of its procs
//        ends as if it had exited, with the cause "its host h2 (tcp:10.0.0.2:7000) was lost: no
//        heartbeat for 3.0 s"; pending calls raise SupervisionError with it, other procs are
//        told (ME-7), and supervision reports it to the meshes' owners. Other hosts are
//        untouched. The verdict is timed to the deadline: exactly lost-after after the
//        host was last heard from (on the runtime's clock; the real one adds only timer
//        latency), never before.
//   HA-5 No orphans. A worker that does not hear from its controller for the lost-after it
//        was given (timed to that deadline, as HA-4's) kills every proc it spawned for it and
//        serves the next controller. A controller that exits cleanly detaches (bounded wait
//        of 1 s), so the worker is free at once. The worker's procs die with it
//        (PR_SET_PDEATHSIG), and its zygote too.
//   HA-6 Output. A worker's procs have pipes as stdout and stderr that the spawner pumps into
//        each proc's log file, then (whole lines) to this agent (PS-4); its zygote has two
//        shared pipes. The worker forwards what it gets to the controller it serves, which
//        writes it to its own stdout or stderr (through an OutputWriter, HA-12).
//   HA-7 Persistent workers. A worker started with `persistent` keeps its procs when its
//        controller detaches or goes silent (HA-5's kill is skipped). Every worker records
//        the proc meshes it spawned: name, the whole mesh's extent, its first rank, and per
//        proc the key, pid and how it ended, recorded as the exit is seen. The record exists
//        before the first child starts; an unnamed mesh's record goes when its procs have all
//        ended, a named one stays until a spawn reuses the name. A name with a live proc is
//        refused to a second spawn. host_lookup hands a named mesh to the controller served
//        now; the controller checks the parts fit (one extent, every rank once), registers the
//        live procs as its own and the ended ones as dead, and tells each live proc its new
//        controller (adopt_procs). Actors are taken over per mesh with the actor layer's adopt
//        (SV-5).
//   HA-8 Shutdown. HostMesh.shutdown() ends this controller's use of those hosts: it marks
//        each host's procs released and the host unusable ("it was shut down"), then sends
//        host_detach with stop 1: the worker kills every proc it runs for this controller, a
//        persistent worker too, serves no controller from then on, and answers. Once every
//        worker answered, or after PODIUM_ATTACH_TIMEOUT_MS (a warning names each that did
//        not), each proc ends as expected, with the cause "its host h2 (tcp:...) was shut
//        down"; other procs are told (ME-7), and supervision hears nothing.
//   HA-16 A worker that is not persistent ends once a controller shut its host down (HA-8):
//        after answering the host_detach (kExitAfterShutdown for the answer to leave), it
//        asks its proc to exit, and serve_worker returns, having stopped its zygote and
//        killed its procs (no process of the worker is left). A persistent worker serves the
//        next controller instead (HA-7).
//   HA-17 Attach fails fast where nothing listens. With each host_attach the controller
//        dials the worker once (channel::probe): a refused connection, a missing socket file
//        or an unreachable network fails that host at once ("cannot attach host 0 (tcp:...):
//        attach failed: Connection refused ..."), not after the attach timeout; a slow or
//        silent network is left to HA-3.
//   HA-9 Values a peer supplies are bounded. The lost-after a controller asks for in
//        host_attach is clamped to 100 ms .. 60 s (with a warning naming the controller), and
//        a host_spawn for 0 or more than 4,096 procs is refused with the limit named. A
//        malformed message is answered with its reason when it carries a request, else logged
//        (rate-limited) with it (HP-1).
//   HA-10 An attach given up on is not adopted. When the controller declares a worker
//        unreachable, it sends that worker a host_detach (stop 0) behind the attach, on the
//        same ordered link (CH-1); a host_attached that arrives after the verdict is answered
//        with another detach.
//   HA-11 Only the controller served commands the worker. host_spawn, host_kill, host_detach,
//        host_lookup and heartbeats are obeyed only when their sender (actor::system_message
//        stamps it) is exactly the controller this worker serves: the sender's proc address,
//        incarnation included, equals the controller's (no prefix match). Any other is refused:
//        answered when it carries a request, otherwise logged (rate-limited) naming the sender.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "podium/actor/proc.h"
#include "podium/base/clock_timer.h"
#include "podium/base/log.h"
#include "podium/channel/net.h"
#include "podium/mesh/host_output.h"
#include "podium/mesh/host_protocol.h"
#include "podium/mesh/proc_spawner.h"

namespace podium::mesh {

class HostAgent {
 public:
  // HA-9's bounds.
  static constexpr uint64_t kMinLostAfterMs = 100;
  static constexpr uint64_t kMaxLostAfterMs = 60 * 1000;
  static constexpr uint64_t kMaxProcsPerSpawn = 4096;
  // HA-16: how long a shut-down worker lets its answer leave before it exits.
  static constexpr std::chrono::milliseconds kExitAfterShutdown{200};

  // `proc` is this worker's root proc (listening on TCP), `spawner` starts its procs,
  // `output` writes their output while no controller is served. `clock` is what its
  // heartbeats and its lost-controller verdict (HA-5) read; null: the real clock.
  HostAgent(actor::Proc& proc, ProcSpawner& spawner, OutputWriter& output, bool persistent,
            std::shared_ptr<base::Clock> clock = nullptr);
  ~HostAgent();
  HostAgent(const HostAgent&) = delete;
  HostAgent& operator=(const HostAgent&) = delete;

  // A worker run until its host is shut down (run_worker_loop_until_shutdown): once the
  // controller shuts this host down (host_detach with stop, HA-8) and the answer is sent, the
  // proc is asked to exit, which ends serve_worker. Before start().
  void end_on_shutdown() { end_on_shutdown_ = true; }

  // Registers the worker's system operations on the proc, opens the output pipes (and gives
  // them to the spawner), starts the heartbeat. Before the proc serves held system ops.
  [[nodiscard]] Status start();
  // A worker on a Unix socket (ipc://PATH) starts its procs on Unix sockets in `dir` (0700),
  // not on TCP ports. Before start().
  void use_unix_sockets(std::string dir) { unix_dir_ = std::move(dir); }
  // No message is acted on after it returns, timers are cancelled and the spawn thread is
  // joined. Before the proc and the spawner stop.
  void stop();

  // An undeliverable message to `dest_key` is expected: it is a controller this worker
  // serves no more (its answer to one that left).
  bool expects_undeliverable(const std::string& dest_key);

  // Messages refused so far: malformed, or from a sender that is not the controller (tests).
  uint64_t refused() const { return refused_.load(); }

 private:
  struct Child {
    pid_t pid = -1;
    std::optional<channel::PortReservation> port;  // none for a proc on a Unix socket
  };
  // A proc mesh spawned here (HA-7).
  struct Mesh {
    uint64_t serial = 0;     // this worker's own number for it
    bool spawning = true;    // its procs are being started: it stays, even with all exited
    std::string name;        // "" when spawned without one
    std::string extent;      // the whole mesh's, ndslice codec bytes
    uint64_t first = 0;      // its first rank on this host
    std::string controller;  // the controller it belongs to: its spawner or its adopter
    std::vector<std::string> keys;
    std::vector<int64_t> pids;
    std::vector<std::string> exits;  // "" while alive, else how it ended
    bool all_exited() const;
  };
  struct Output;

  void on_attach(const actor::SystemHeader& h, const std::string& sender);
  void on_spawn(const actor::SystemHeader& h, const std::string& sender);
  void on_kill(const actor::SystemHeader& h, const std::string& sender);
  void on_detach(const actor::SystemHeader& h, const std::string& sender);
  void on_lookup(const actor::SystemHeader& h, const std::string& sender);
  void on_beat(const actor::SystemHeader& h, const std::string& sender);

  void spawn(proto::HostSpawn m);
  void child_exited(const std::string& key, const host::ExitStatus& s);
  void release(const std::string& why, bool stop = false);
  void tick();
  void read_output(int i);
  void forward_output(int fd, std::string data);

  // HA-11: whether `sender` is the controller served now (a heartbeat: heard from now);
  // else the reason it is not. mu_ not held.
  std::optional<std::string> not_controller(const std::string& sender);
  // A malformed or unauthorised message: logged (rate-limited) with `why`, counted.
  void refuse(const std::string& op, const std::string& sender, const std::string& why);
  // Answers `sender` (a proc's system actor) with `h`; logs when the sender names no proc.
  void answer(const std::string& sender, actor::SystemHeader h);
  void send(const channel::Address& to, actor::SystemHeader h);
  Mesh* live_mesh_named(const std::string& name);  // mu_ held
  Mesh* mesh_by_serial(uint64_t serial);           // mu_ held
  std::string where() const;                       // "host h (worker tcp:...)"

  actor::Proc& proc_;
  bool end_on_shutdown_ = false;  // set before start(), read on the proc's thread after
  ProcSpawner& spawner_;
  OutputWriter& output_;
  const bool persistent_;
  const std::shared_ptr<base::Clock> clock_;
  const std::string key_;  // proc_.id().to_string()
  JobThread spawns_{"the host agent's spawn"};
  base::RateLimitedLog refusals_;
  std::atomic<uint64_t> refused_{0};
  std::unique_ptr<Output> out_;  // the forwarding pipes; owned by the loop after start()

  mutable std::mutex mu_;  // guards everything below
  bool stopped_ = false;
  std::optional<channel::Address> controller_;  // the one served now
  std::string controller_key_;
  uint64_t host_mesh_ = 0, host_index_ = 0;
  std::string advertise_;  // the host name procs listen on: the one the controller dialled
  std::chrono::milliseconds lost_after_{3000};
  base::SteadyTime last_heard_{};
  std::unordered_map<std::string, Child> children_;  // by proc key
  std::vector<Mesh> meshes_;                         // in spawn order (HA-7)
  uint64_t next_serial_ = 0;
  std::unique_ptr<base::Timer> timer_;
  std::unique_ptr<base::Timer> exit_timer_;  // HA-16: a shut-down worker's exit
  std::string unix_dir_;  // set before start(): procs listen on Unix sockets here
};

}  // namespace podium::mesh
