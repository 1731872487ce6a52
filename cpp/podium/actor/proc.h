// podium::actor::Proc — the actor runtime of one OS process.
//
// A Proc owns an io_context run by an Executor, a channel::Net listening at the proc's
// address, the table of its actors and the ports opened in it. Messages that arrive are routed
// by their dest: actor mailboxes (port 0) queue them for the actor's turn; ports run their
// handler at once on the delivering thread; the system port ("proc[0]:0") spawns and stops
// actors. Local sends skip the channel and are routed on the sender's thread.
//
// Threads: every public member is thread-safe. Port handlers run on whichever thread delivers
// (a runner, or the local sender) and must not block.
// Invariants:
//   AC-6 An actor runs one handler at a time, in arrival order; its factory runs first.
//   AC-7 Handlers of different actors run in parallel (Executor, AC-2).
//   AC-8 A message for an actor or port that does not exist, or an actor that stopped or
//        failed, is answered with an error naming the actor and the reason when it carries a
//        reply port, and reported to the undeliverable hook otherwise. Nothing is dropped
//        silently, except a reply to a port that was already closed (its caller gave up),
//        which is logged at debug level.
//   AC-9 A stop drains the messages queued before it, runs cleanup(), then refuses later ones.
//   AC-10 Constructs and stops never run inside a DeliveryOnlyScope; they wait for another
//        thread, which the loop provides once the scoped thread stops driving.
//   AC-11 Calls (kCall) from one sender to one actor are handled in send order, whichever way
//        they travel (direct, or through a cast tree: mesh/relay.h). The sender stamps each
//        with its stream (sender_stream(): a hash of its ActorId, or of this proc's id for
//        threads outside actors) and the next number of that (stream, actor) pair; the
//        receiving proc holds back a call that arrives early, drops a duplicate (a tree that
//        re-sent a subtree around a dead relay), and skips a gap left unfilled for
//        kOrderGapTimeout with a warning, so one lost message never stalls a stream. Both
//        ends count per (stream, destination text): an actor reached under two spellings of
//        its proc's address (with and without its CH-12 incarnation) has two streams.
//   AC-12 traffic() counts the envelopes this proc sent to and received from other procs
//        (local routing not counted): the cast benchmark's controller load.
//   SV-1 An actor spawned with a supervisor (the "spawn" message names the owner process's
//        address and the mesh's supervision id) that fails — its constructor fails, a handler
//        returns an Error, fail_actor() — sends exactly one "actor_failed" system message to
//        that process, carrying a MeshFailure. A stop is not a failure and sends nothing.
//   SV-5 A system "adopt" [name, supervisor] [index, supervision id] moves a running actor's
//        supervision to a new owner (a controller that re-attached to persistent procs):
//        its later failure is reported there. It is answered with an error when the actor
//        does not exist, or failed or stopped (the cause).
//   AC-11's streams are salted per process: a process that reuses a dead one's address (a
//        controller restarted on the same port) starts new streams, not the old ones' tail.
//        The gap timer reads ProcConfig::clock (base/clock.h); ordering.h holds both ends.
//   AC-18 A proc remembers why its last ProcConfig::ended_actors_kept actors that ended
//        (stopped or failed) ended, and refuses their messages with that cause (AC-8); a
//        message for one that ended longer ago is refused as for an actor that never
//        existed (kNoSuchActor). So the table of ended actors stays bounded in a long-lived
//        proc that spawns and stops actors all its life.
//
// The implementation is split by concern; proc_impl.h maps the files.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "podium/actor/actor.h"
#include "podium/actor/drive.h"
#include "podium/actor/ids.h"
#include "podium/actor/message.h"
#include "podium/actor/ordering.h"
#include "podium/base/clock.h"
#include "podium/base/error.h"
#include "podium/channel/address.h"
#include "podium/channel/net.h"
#include "podium/wire/envelope.h"

namespace asio {
class io_context;
}

namespace podium::actor {

class Executor;

// How long a receiver holds calls behind a missing one before skipping it (AC-11).
inline constexpr std::chrono::seconds kOrderGapTimeout{10};
// How many ended actors' causes a proc keeps by default (AC-18).
inline constexpr size_t kEndedActorsKept = 4096;

struct ProcConfig {
  channel::Address listen;  // where the proc's Net listens; its ProcId
  channel::Config channel;
  // Registered system operations (on_system) that arrive before serve_held_system_ops() are
  // held, not run or refused: an owner that registers its handlers after make() (the mesh
  // runtime) misses none that peers send as soon as the proc listens, and its handlers run
  // only once it is ready. spawn, stop and exit are served at once.
  bool hold_system_ops = false;
  // The time the proc's timers read (AC-11's gap timer), and its Net's unless channel.clock
  // is set. Null: the real clock. Tests pass a base::ManualClock (docs/actor.md).
  std::shared_ptr<base::Clock> clock;
  // AC-18.
  size_t ended_actors_kept = kEndedActorsKept;
  // A worker's DIAL@BIND (channel/address.h): its ProcId is `advertise` (a port of 0: the
  // bound one) while its Net listens on `listen`; `listen_fd` >= 0: on that inherited socket.
  std::optional<channel::Address> advertise;
  int listen_fd = -1;
  // A client attached through the gateway at `via` (channel GW-1, Monarch's attach()): the
  // proc listens nowhere; its ProcId is the routed address the gateway names, awaited up to
  // `via_timeout` (the attach fails naming the gateway and why). `listen` is unused.
  std::optional<channel::Address> via;
  std::chrono::milliseconds via_timeout{10'000};
  // A worker: serves clients that attach through it (channel GW-2..GW-4), as `gateway` (its
  // address as procs reach it; a port of 0: the bound one).
  std::optional<channel::Address> gateway;
};

class Proc {
 public:
  using PortHandler = std::function<void(wire::Envelope&&)>;
  using SystemHandler = std::function<void(const SystemHeader&, wire::Envelope&&)>;
  using UndeliverableHook = std::function<void(const wire::Envelope&, const Error&)>;

  [[nodiscard]] static Result<std::unique_ptr<Proc>> make(ProcConfig config);
  ~Proc();
  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;

  const ProcId& id() const;
  asio::io_context& io();
  Executor& executor();

  // Delivers `env` to the proc at `to`; routed locally when `to` is this proc.
  void send(const channel::Address& to, wire::Envelope env);
  // Sends `env` to the proc named in env.dest.
  void send(wire::Envelope env);
  // AC-11: the ordering stream of whoever sends from this thread, and the next sequence
  // number of (stream, `dest`). send() stamps unstamped calls itself; a cast tree stamps the
  // calls it carries when the cast starts.
  uint64_t sender_stream() const;
  // The largest frame this proc's channel sends or accepts (channel::Config::max_frame_bytes):
  // a message over it is refused, by the sender's channel or the receiver's.
  size_t max_frame_bytes() const;
  uint64_t next_seq(uint64_t stream, std::string_view dest);
  // The next numbers of every dest in `dests` (out[i] for dests[i]), under one lock; with
  // `dests` empty, of `one` into out[0].
  void next_seqs(uint64_t stream, std::span<const std::string* const> dests,
                 std::string_view one, uint64_t* out);
  // The counters behind next_seqs() for `dests` on `stream`, for a sender that casts to the
  // same actors again and again (mesh::CastTargets keeps them): valid while the SeqSlots
  // lives, even once forget_dests() dropped their dests. next_seqs(slots.slots, out) then
  // takes each one's next number under one lock, without hashing.
  using SeqSlots = actor::SeqSlots;  // ordering.h
  SeqSlots seq_slots(uint64_t stream, std::span<const std::string* const> dests);
  void next_seqs(std::span<uint64_t* const> slots, uint64_t* out);
  // The procs `proc_keys` (ProcId texts) have ended and nothing here addresses them any more
  // (mesh ME-11): the AC-11 counters of their actors are dropped, so that a sender that
  // outlives many procs keeps counters only for those it can still call, and so are the
  // streams they sent here on (AC-16).
  void forget_dests(std::span<const std::string> proc_keys);
  // What the AC-11 state holds (tests): streams this proc sends on, streams it receives.
  struct OrderingState {
    size_t sending_streams = 0;
    size_t receiving_streams = 0;
  };
  OrderingState ordering_state() const;
  // The actors whose end this proc remembers (AC-18; tests).
  size_t ended_actor_count() const;
  // AC-12.
  struct Traffic {
    uint64_t sent = 0;
    uint64_t received = 0;
  };
  Traffic traffic() const;

  // The proc at `peer` has ended: drops this proc's link to it (channel CH-11), handing back
  // what it still held with `why`, and the streams it sent here on (AC-16). Links to procs
  // that come and go are not kept forever.
  void forget_peer(const channel::Address& peer, const std::string& why);
  // How many peers this proc holds a link to (tests).
  size_t link_count() const;
  // Its Net's counters and lend table (channel CH-15, CH-26; tests and stats).
  channel::NetStats channel_stats() const;
  // DB-8 (docs/interactive.md): also accepts TCP connections on `addr` and serves them as a
  // gateway (channel GW-1..GW-4): a client that attaches there (the `podium debug` / `exec`
  // / `logs` / `dashboard` commands) reaches this proc's actors after the channel's setup
  // (the job's secret, CH-8; TLS, CH-9). Returns the bound address (port 0 becomes the
  // chosen one). Refused in a proc that reaches others through a gateway itself, or that is
  // a gateway already for another address. Thread-safe.
  [[nodiscard]] Result<channel::Address> serve_gateway(const channel::Address& addr);

  // Sends a kReply for `reply_port` (a PortId text), carrying `value` or `error`.
  void send_reply(std::string_view reply_port, uint64_t rank, Result<std::vector<Buffer>> value);

  // Creates actor `name[index]` here. The factory runs as the mailbox's first item.
  [[nodiscard]] Result<ActorId> spawn(std::string name, uint32_t index, ActorFactory factory);
  // Queues a stop after the actor's pending messages (AC-9); `done` runs after cleanup().
  [[nodiscard]] Status stop_actor(std::string_view local_key, std::function<void(Status)> done);
  // Fails the actor after the messages queued before this (later ones are refused with
  // `cause`) and reports the failure to its supervisor (SV-1). Nothing if it is gone already.
  void fail_actor(std::string_view local_key, Error cause);

  // Opens a port under this proc's system actor. A once-port closes after its first message.
  PortId open_port(PortHandler handler, bool once);
  void close_port(uint64_t port);
  // The text form of port `port` of this proc's system actor (what open_port's PortId
  // prints), built from a cached prefix: the reply address of every call.
  std::string port_text(uint64_t port) const;

  // Handles system operations this layer does not know (the mesh layer's "ready", ...).
  void on_system(std::string op, SystemHandler handler);
  // Ends the hold of ProcConfig::hold_system_ops: held operations run now (or are refused if
  // still unknown), later ones as they arrive.
  void serve_held_system_ops();
  void on_undeliverable(UndeliverableHook hook);

  // A system "exit" message was received (a worker's cue to leave its main loop).
  bool wait_exit_requested(std::chrono::nanoseconds timeout);
  void request_exit();

  // Stops the Net, the runners and every actor. Idempotent.
  void stop();

  struct Impl;  // proc_impl.h

 private:
  Proc();
  std::unique_ptr<Impl> impl_;
};

// current_actor(), current_actor_text(), DeliveryOnlyScope and help_while_waiting() are in
// drive.h (included above).

}  // namespace podium::actor
