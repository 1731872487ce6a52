// Internal to podium_actor: Proc::Impl, the state behind a Proc, and where each concern lives.
//
//   proc.cc          Proc itself: make, send, route and bounce (AC-8, AC-14), stop
//   mailbox.cc       the mailboxes: enqueue, drain, construct, stop, fail (AC-6, AC-9, AC-10)
//   supervision.cc   failure reports and adoption (SV-1, SV-5)
//   system_port.cc   the system port "proc[0]:0": spawn, adopt, stop, exit, extensions
//   ordering.{h,cc}  AC-11: SeqCounters (sender) and OrderedInbox (receiver, gap timer)
//   ports.{h,cc}     PortTable (AC-13)
//   drive.{h,cc}     which thread drains a mailbox; every thread_local; HelpGate (AC-17)
//
// Threads: every field group names its guard below; immutable ones are set by Proc::make()
// before the Net listens and the executor starts. Lock order: cells_mu, then a Mailbox's mu
// (never the other way); hooks_mu, OrderedInbox's and SeqCounters' locks and the port table's
// are leaves. Nothing calls out (handlers, hooks, the Net) with one of these held, except
// cells_mu's shared lock around a map lookup.
#pragma once

#include <asio/io_context.hpp>
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "podium/actor/drive.h"
#include "podium/actor/executor.h"
#include "podium/actor/mailbox.h"
#include "podium/actor/ordering.h"
#include "podium/actor/ports.h"
#include "podium/actor/proc.h"
#include "podium/actor/signal.h"

namespace podium::actor {

Error actor_error(ActorErrc code, const std::string& who, std::string_view why);

struct Proc::Impl {
  using Item = Mailbox::Item;

  explicit Impl(const ProcConfig& config);

  // --- immutable after make() ------------------------------------------------------------
  ProcId id;
  std::string id_text;      // id.to_string()
  ActorId system_id;
  std::string port_prefix;  // system_id.to_string() + ":"
  uint64_t proc_stream = 0;  // this proc's own AC-11 stream
  // Mixed into every stream this process sends on, so that a process that reuses a dead
  // one's address (a controller restarted on its port) starts fresh streams (AC-11).
  uint64_t stream_salt = 0;
  std::shared_ptr<base::Clock> clock;  // null: the real clock (base/clock.h)
  size_t ended_kept = kEndedActorsKept;
  Proc* self = nullptr;

  // The default concurrency hint keeps Asio's scheduler multi-thread aware: work posted by a
  // handler stays visible to the runners the Executor adds when that handler runs long.
  asio::io_context io;
  Executor executor{io};
  std::unique_ptr<channel::Net> net;
  // The address this proc serves as a gateway on (ProcConfig::gateway, set in make() before
  // the proc is shared; or serve_gateway()). Guarded by gateway_mu.
  std::mutex gateway_mu;
  std::optional<channel::Address> gateway_addr;
  // AC-17: threads that help drain a mailbox (drive.h) enter it; stop() closes it.
  std::shared_ptr<internal::HelpGate> help_gate = std::make_shared<internal::HelpGate>();

  // --- actors (mailbox.cc) ------------------------------------------------------------------
  std::shared_mutex cells_mu;  // guards cells, ended, ended_order
  StringMap<std::shared_ptr<Mailbox>> cells;
  // Why recently ended actors ended, for clear refusals (AC-18): at most ended_kept, oldest
  // dropped first.
  StringMap<Error> ended;
  std::deque<std::string> ended_order;
  std::atomic<uint64_t> incarnations{0};  // numbers each mailbox's AC-11 stream

  // --- ordering (ordering.h) ----------------------------------------------------------------
  SeqCounters seqs;
  std::unique_ptr<OrderedInbox> inbox;

  // --- ports (ports.h) ----------------------------------------------------------------------
  PortTable ports;

  // --- system port and hooks (system_port.cc) -----------------------------------------------
  std::mutex hooks_mu;  // guards system_handlers, undeliverable_hook, holding, held
  StringMap<std::shared_ptr<SystemHandler>> system_handlers;
  std::shared_ptr<UndeliverableHook> undeliverable_hook;
  bool holding = false;              // ProcConfig::hold_system_ops, until served
  std::vector<wire::Envelope> held;  // extension system operations received while holding

  Signal exit_requested;
  std::atomic<bool> stopped{false};
  std::atomic<uint64_t> sent_remote{0};
  std::atomic<uint64_t> received_remote{0};

  // proc.cc
  void route(wire::Envelope&& env);
  std::optional<Error> for_an_earlier_incarnation(std::string_view proc) const;
  void route_to_actor(wire::Envelope&& env);
  void deliver_to_port(uint64_t port, wire::Envelope&& env);
  void bounce(wire::Envelope&& env, Error why);  // AC-8
  uint64_t stream_hash(std::string_view text) const;
  void stamp(wire::Envelope& env);
  static std::string_view system_key();

  // mailbox.cc
  void enqueue(const std::shared_ptr<Mailbox>& cell, Item&& item);
  void drain(const std::shared_ptr<Mailbox>& cell);
  static void drain_for_helper(void* impl, const std::shared_ptr<void>& mailbox);
  void process(Mailbox& cell, Item&& item);
  void construct(Mailbox& cell, wire::Envelope&& spawn_msg);
  void fail(Mailbox& cell, Error cause);
  void refuse(Item&& item, const Error& cause);
  void stop_cell(Mailbox& cell, std::function<void(Status)> done);
  void ended_locked(Mailbox& cell, const Error& cause);  // under cells_mu (exclusive)
  std::shared_ptr<Mailbox> find(std::string_view local_key, std::optional<Error>* why);
  Result<std::shared_ptr<Mailbox>> make_cell(std::string name, uint32_t index,
                                             ActorFactory factory, std::string supervisor = {},
                                             uint64_t supervision_id = 0);

  // supervision.cc
  void supervise(Mailbox& cell, wire::Envelope&& env);
  void report_failure(Mailbox& cell, const Error& cause);
  void system_adopt(const SystemHeader& h, const std::string& reply);

  // system_port.cc
  void handle_system(wire::Envelope&& env);
  void system_spawn(const SystemHeader& h, wire::Envelope&& env);
};

}  // namespace podium::actor
