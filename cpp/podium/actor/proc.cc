#include "podium/actor/proc.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <atomic>
#include <limits>
#include <random>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>
#include <unordered_set>

#include "podium/actor/executor.h"
#include "podium/actor/signal.h"

namespace podium::actor {
namespace {

thread_local const ActorId* tls_current_actor = nullptr;
thread_local const std::string* tls_current_actor_text = nullptr;  // its to_string(), cached

// The last mailbox a non-runner thread scheduled, which that thread may drain itself when it
// then blocks without a timeout (help_while_waiting). `life` expires with the proc.
struct HelpCandidate {
  void* proc = nullptr;
  std::weak_ptr<void> life;
  std::weak_ptr<void> cell;
};
thread_local HelpCandidate tls_help;

// While a runner delivers a batch of envelopes from the channel, the first mailbox it makes
// ready is run right after the batch (Net::on_batch_end) on the same thread instead of being
// posted, which would first poll the reactor once more. Other mailboxes are posted, so one
// slow handler never holds up the rest of the batch.
thread_local void* tls_batch_proc = nullptr;
// DeliveryOnlyScope: this thread runs message deliveries only; whether it left other work.
thread_local bool tls_delivery_only = false;
thread_local bool tls_deferred = false;
thread_local std::shared_ptr<void> tls_batch_cell;

// Messages an actor handles per turn before yielding its runner to other actors.
constexpr int kDrainBudget = 64;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

Error actor_error(ActorErrc code, const std::string& who, std::string_view why) {
  std::string msg = who;
  msg += ": ";
  msg += why;
  return make_error(code, std::move(msg));
}

}  // namespace

const ActorId* current_actor() { return tls_current_actor; }
const std::string* current_actor_text() { return tls_current_actor_text; }

struct Proc::Impl {
  struct Item {
    enum class Type : uint8_t { kMessage, kConstruct, kStop, kFail };
    Type type = Type::kMessage;
    wire::Envelope env;
    std::function<void(Status)> done;  // kStop
    Error cause = {};                  // kFail
  };

  struct Cell {
    enum class State : uint8_t { kCreated, kRunning, kStopped, kFailed };
    ActorId id;
    std::string key;                   // id.local_key(), immutable
    std::string id_text;               // id.to_string(), immutable
    ActorFactory factory;              // consumed by the kConstruct item (runner only)
    std::unique_ptr<ActorBase> actor;  // runner only: touched inside drain()
    std::mutex mu;             // guards the fields below
    // Where its failure is reported (SV-1): the owner process's address and the mesh's id
    // there; empty when nobody supervises it. A new owner may take over (SV-5, "adopt").
    std::string supervisor;
    uint64_t supervision_id = 0;
    std::deque<Item> queue;
    bool scheduled = false;    // a drain is posted (or the queue is being drained)
    bool running = false;      // a thread is inside drain() for this cell
    State state = State::kCreated;
    Error cause;               // why it failed or stopped
  };

  ProcId id;
  std::string id_text;  // id.to_string(), immutable after make()
  // The default concurrency hint keeps Asio's scheduler multi-thread aware: work posted by a
  // handler stays visible to the runners the Executor adds when that handler runs long.
  asio::io_context io;
  Executor executor{io};
  std::unique_ptr<channel::Net> net;
  ActorId system_id;
  std::string port_prefix;  // system_id.to_string() + ":", immutable after make()

  std::shared_mutex cells_mu;                  // guards cells, gone
  StringMap<std::shared_ptr<Cell>> cells;
  StringMap<Error> gone;                       // stopped or failed actors, for clear refusals

  struct PortEntry {
    std::shared_ptr<PortHandler> handler;
    bool once = false;
  };
  std::mutex ports_mu;                         // guards ports
  std::unordered_map<uint64_t, PortEntry> ports;
  std::atomic<uint64_t> next_port{1};

  std::mutex hooks_mu;  // guards system_handlers, undeliverable_hook, holding, held
  StringMap<std::shared_ptr<SystemHandler>> system_handlers;
  std::shared_ptr<UndeliverableHook> undeliverable_hook;
  bool holding = false;               // ProcConfig::hold_system_ops, until served
  std::vector<wire::Envelope> held;   // extension system operations received while holding

  Signal exit_requested;
  std::atomic<bool> stopped{false};

  Proc* self = nullptr;
  std::shared_ptr<int> life = std::make_shared<int>(0);  // weak refs see the proc's end

  // --- routing -------------------------------------------------------------------------

  void route(wire::Envelope&& env) {
    auto v = split_port_id(env.dest);
    if (!v) {
      bounce(std::move(env), v.error());
      return;
    }
    if (id.addr.incarnation != 0) {
      if (auto why = for_an_earlier_incarnation(v->addr)) {
        bounce(std::move(env), std::move(*why));
        return;
      }
    }
    if (v->local_key == system_key()) {
      if (v->port == kMailboxPort) {
        handle_system(std::move(env));
      } else {
        deliver_to_port(v->port, std::move(env));
      }
      return;
    }
    if (env.kind == static_cast<uint8_t>(MessageKind::kCall) && env.order_stream != 0) {
      // Keyed as the sender numbers them: per destination text, so that an actor reached
      // under two spellings of this proc's address (an alias) gets two streams rather than
      // one whose second numbering looks like duplicates of the first.
      std::string key = std::to_string(env.order_stream);
      key += ' ';
      key += env.dest;
      route_ordered(std::move(key), std::move(env));
      return;
    }
    route_to_actor(std::move(env));
  }

  // AC-14 (CH-12): a message for the proc that listened at this address before (same host
  // and port, another incarnation) must not reach this proc's actors or ports, whose names
  // and port numbers may well be the same as the dead one's. An address with no incarnation,
  // or another host name, is not judged: it may be an alias of this one.
  std::optional<Error> for_an_earlier_incarnation(std::string_view proc) const {
    if (proc == id_text) return std::nullopt;
    auto a = channel::Address::parse(proc);
    if (!a || a->incarnation == 0 || a->incarnation == id.addr.incarnation ||
        a->transport != id.addr.transport || a->target != id.addr.target ||
        a->port != id.addr.port) {
      return std::nullopt;
    }
    return make_error(ActorErrc::kProcExited, "proc " + std::string(proc) +
                                                  " has ended; its address is " + id_text +
                                                  "'s now");
  }

  // --- ordering (AC-11) ----------------------------------------------------------------

  struct OrderIn {
    uint64_t next = 1;                         // the next number to deliver
    std::map<uint64_t, wire::Envelope> early;  // arrived ahead of `next`
    std::deque<wire::Envelope> ready;          // in order, for the delivering thread
    bool delivering = false;                   // a thread is routing `ready`
    std::unique_ptr<asio::steady_timer> gap_timer;  // armed while `early` waits
    uint64_t gap_at = 0;                       // `next` when the timer was armed
  };
  std::mutex order_mu;  // guards order_in, order_out and every OrderIn
  std::unordered_map<std::string, OrderIn> order_in;    // "<stream> <dest>"
  // stream -> dest -> the last number given. seq_slots() gives the dests it meets first one
  // contiguous block, in their order, so that a cast to a mesh walks its counters in memory
  // order. A block lives while a dest in it is here or a SeqSlots holds it: forget_dests()
  // drops the dests of ended procs, and a cached SeqSlots stays valid.
  struct Counter {
    uint64_t* value;
    std::shared_ptr<uint64_t[]> block;
  };
  std::unordered_map<uint64_t, StringMap<Counter>> order_out;

  static std::shared_ptr<uint64_t[]> new_counters(size_t n) {
    return std::make_shared<uint64_t[]>(n);  // zeroed
  }
  uint64_t proc_stream = 0;  // this proc's own stream, immutable after make()
  // Mixed into every stream this process sends on, so that a process that reuses a dead
  // one's address (a controller restarted on its port) starts fresh streams (AC-11).
  uint64_t stream_salt = 0;  // immutable after make()
  std::atomic<uint64_t> sent_remote{0};
  std::atomic<uint64_t> received_remote{0};

  uint64_t stream_hash(std::string_view text) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : text) {
      h ^= c;
      h *= 1099511628211ull;
    }
    h ^= stream_salt;
    return h == 0 ? 1 : h;
  }

  void stamp(wire::Envelope& env) {
    if (env.kind != static_cast<uint8_t>(MessageKind::kCall) || env.order_stream != 0) return;
    env.order_stream = self->sender_stream();
    env.order_seq = self->next_seq(env.order_stream, env.dest);
  }

  void route_ordered(std::string key, wire::Envelope&& env) {
    std::unique_lock lock(order_mu);
    OrderIn& in = order_in[key];  // node-based: the reference outlives later inserts
    uint64_t seq = env.order_seq;
    if (seq < in.next) {
      spdlog::debug("podium: dropping duplicate call {} of stream {} to {}", seq,
                    env.order_stream, env.dest);
      return;
    }
    if (seq > in.next) {
      in.early.emplace(seq, std::move(env));
      if (!in.gap_timer) arm_gap_timer(key, in);
      return;
    }
    in.ready.push_back(std::move(env));
    ++in.next;
    release_early(in);
    deliver_ready(lock, in);
  }

  // Moves the calls that now follow `next` from `early` to `ready`.
  static void release_early(OrderIn& in) {
    while (!in.early.empty() && in.early.begin()->first == in.next) {
      in.ready.push_back(std::move(in.early.begin()->second));
      in.early.erase(in.early.begin());
      ++in.next;
    }
  }

  // Routes `ready` outside the lock; one thread at a time per stream keeps the order.
  void deliver_ready(std::unique_lock<std::mutex>& lock, OrderIn& in) {
    if (in.delivering) return;
    in.delivering = true;
    while (!in.ready.empty()) {
      wire::Envelope next = std::move(in.ready.front());
      in.ready.pop_front();
      lock.unlock();
      route_to_actor(std::move(next));
      lock.lock();
    }
    in.delivering = false;
  }

  void arm_gap_timer(const std::string& key, OrderIn& in) {
    in.gap_at = in.next;
    in.gap_timer = std::make_unique<asio::steady_timer>(io, kOrderGapTimeout);
    std::weak_ptr<int> alive = life;
    in.gap_timer->async_wait([this, key, alive](std::error_code ec) {
      if (ec || !alive.lock()) return;
      on_gap_timeout(key);
    });
  }

  void on_gap_timeout(const std::string& key) {
    std::unique_lock lock(order_mu);
    auto it = order_in.find(key);
    if (it == order_in.end()) return;
    OrderIn& in = it->second;
    in.gap_timer.reset();
    if (in.early.empty()) return;
    if (in.next == in.gap_at) {
      uint64_t first = in.early.begin()->first;
      spdlog::warn("podium: calls {}..{} of stream {} never arrived within {} s; delivering "
                   "the {} that followed",
                   in.next, first - 1, key, kOrderGapTimeout.count(), in.early.size());
      in.next = first;
      release_early(in);
      deliver_ready(lock, in);
      if (in.early.empty()) return;
    }
    if (!in.gap_timer) arm_gap_timer(key, in);
  }

  void route_to_actor(wire::Envelope&& env) {
    auto v = split_port_id(env.dest);
    if (!v) {
      bounce(std::move(env), v.error());
      return;
    }
    std::shared_ptr<Cell> cell;
    {
      std::shared_lock lock(cells_mu);
      auto it = cells.find(v->local_key);
      if (it != cells.end()) {
        cell = it->second;
      } else if (auto g = gone.find(v->local_key); g != gone.end()) {
        Error e = g->second;
        lock.unlock();
        bounce(std::move(env), std::move(e));
        return;
      }
    }
    if (!cell) {
      std::string why = "no actor '" + std::string(v->local_key) + "' in proc " + id.to_string();
      bounce(std::move(env), make_error(ActorErrc::kNoSuchActor, std::move(why)));
      return;
    }
    if (v->port != kMailboxPort) {
      bounce(std::move(env), make_error(ActorErrc::kNoSuchPort,
                                        "actor ports other than 0 live under proc[0]: " + env.dest));
      return;
    }
    enqueue(cell, Item{Item::Type::kMessage, std::move(env), nullptr});
  }

  std::string_view system_key() const {
    static const std::string key = std::string(kSystemActorName) + "[0]";
    return key;
  }

  void deliver_to_port(uint64_t port, wire::Envelope&& env) {
    std::shared_ptr<PortHandler> handler;
    {
      std::lock_guard lock(ports_mu);
      auto it = ports.find(port);
      if (it != ports.end()) {
        handler = it->second.handler;
        if (it->second.once) ports.erase(it);
      }
    }
    if (!handler) {
      // A reply that arrives after its caller gave up (or a second reply to a once-port).
      if (env.kind == static_cast<uint8_t>(MessageKind::kReply)) {
        spdlog::debug("podium: dropping reply for closed port {}", env.dest);
        return;
      }
      bounce(std::move(env), make_error(ActorErrc::kNoSuchPort,
                                        "port " + env.dest + " is closed or never existed"));
      return;
    }
    (*handler)(std::move(env));
  }

  // AC-8: answers an undeliverable message's reply port, else tells the hook.
  void bounce(wire::Envelope&& env, Error why) {
    auto reply = reply_port_of(env);
    if (!reply.empty() && env.kind != static_cast<uint8_t>(MessageKind::kReply)) {
      uint64_t rank = 0;
      if (env.kind == static_cast<uint8_t>(MessageKind::kCall) && !env.parts.empty()) {
        if (auto h = decode_call_header(env.parts[0])) rank = h->rank;
      }
      self->send_reply(std::string(reply), rank, std::unexpected(std::move(why)));
      return;
    }
    std::shared_ptr<UndeliverableHook> hook;
    {
      std::lock_guard lock(hooks_mu);
      hook = undeliverable_hook;
    }
    if (hook) {
      (*hook)(env, why);
    } else {
      spdlog::warn("podium: undeliverable message from {} to {}: {}", env.sender, env.dest,
                   why.to_string());
    }
  }

  // --- mailboxes -----------------------------------------------------------------------

  void enqueue(const std::shared_ptr<Cell>& cell, Item&& item) {
    std::unique_lock lock(cell->mu);
    if (item.type == Item::Type::kMessage &&
        (cell->state == Cell::State::kStopped || cell->state == Cell::State::kFailed)) {
      Error e = cell->cause;
      lock.unlock();
      bounce(std::move(item.env), std::move(e));
      return;
    }
    cell->queue.push_back(std::move(item));
    if (cell->scheduled) return;
    cell->scheduled = true;
    lock.unlock();
    if (tls_batch_proc == this && !tls_batch_cell) {
      tls_batch_cell = cell;
      return;
    }
    if (!Executor::current()) {
      // A thread outside the runtime (a controller's main thread) that waits for the answer
      // right after sending may run this drain itself (help_while_waiting).
      tls_help = HelpCandidate{this, life, cell};
    }
    asio::post(io, [this, cell] { drain(cell); });
  }

  // Runs the cell's queued items. Whoever gets here first (the posted drain on a runner, or a
  // waiting caller helping) drains; the other finds the cell running or empty and returns.
  void drain(const std::shared_ptr<Cell>& cell) {
    {
      std::lock_guard lock(cell->mu);
      if (cell->running) return;
      if (cell->queue.empty()) {
        cell->scheduled = false;
        return;
      }
      cell->running = true;
    }
    executor.handler_begin();
    const ActorId* outer = tls_current_actor;
    const std::string* outer_text = tls_current_actor_text;
    tls_current_actor = &cell->id;
    tls_current_actor_text = &cell->id_text;
    bool more = true;
    for (int n = 0; n < kDrainBudget; ++n) {
      Item item;
      {
        std::lock_guard lock(cell->mu);
        if (cell->queue.empty()) {
          cell->scheduled = false;
          cell->running = false;
          more = false;
          break;
        }
        // AC-10: leave a construct or stop queued (scheduled stays set) for the drain
        // posted below, which another thread runs once this one stops driving.
        if (tls_delivery_only && cell->queue.front().type != Item::Type::kMessage) {
          tls_deferred = true;
          break;
        }
        item = std::move(cell->queue.front());
        cell->queue.pop_front();
      }
      process(*cell, std::move(item));
    }
    tls_current_actor = outer;
    tls_current_actor_text = outer_text;
    executor.handler_end();
    if (more) {
      {
        std::lock_guard lock(cell->mu);
        cell->running = false;
      }
      asio::post(io, [this, cell] { drain(cell); });
    }
  }

  Cell::State state_of(Cell& cell) {
    std::lock_guard lock(cell.mu);
    return cell.state;
  }

  void process(Cell& cell, Item&& item) {
    switch (item.type) {
      case Item::Type::kConstruct: return construct(cell, std::move(item.env));
      case Item::Type::kStop: return stop_cell(cell, std::move(item.done));
      case Item::Type::kFail: return fail(cell, std::move(item.cause));
      case Item::Type::kMessage: break;
    }
    auto state = state_of(cell);
    if (state != Cell::State::kRunning) {
      Error cause;
      {
        std::lock_guard lock(cell.mu);
        cause = cell.cause;
      }
      bounce(std::move(item.env), std::move(cause));
      return;
    }
    if (item.env.kind == static_cast<uint8_t>(MessageKind::kSupervise)) {
      return supervise(cell, std::move(item.env));
    }
    std::optional<CallHeader> call;
    if (item.env.kind == static_cast<uint8_t>(MessageKind::kCall)) {
      auto h = item.env.parts.empty()
                   ? Result<CallHeader>(std::unexpected(
                         make_error(ActorErrc::kBadArguments, "call without a header part")))
                   : decode_call_header(item.env.parts[0]);
      if (!h) {
        bounce(std::move(item.env), std::move(h.error()));
        return;
      }
      call = std::move(*h);
    }
    Context cx(*self, cell.id, std::string(reply_port_of(item.env)), call ? &*call : nullptr);
    Status st = cell.actor->handle(std::move(item.env), cx);
    if (!st) {
      if (cx.expects_reply() && !cx.replied()) cx.reply_error(st.error());
      fail(cell, std::move(st.error()));
      return;
    }
    if (cx.expects_reply() && !cx.replied()) {
      cx.reply_error(actor_error(ActorErrc::kHandlerFailed, cell.id.to_string(),
                                 "handler returned without replying"));
    }
  }

  // A mesh this actor owns failed: the actor handles it, or fails itself.
  void supervise(Cell& cell, wire::Envelope&& env) {
    auto failure = env.parts.empty()
                       ? Result<MeshFailure>(std::unexpected(make_error(
                             ActorErrc::kBadArguments, "supervision message without a failure")))
                       : decode_mesh_failure(env.parts[0]);
    if (!failure) {
      spdlog::error("podium: {}: {}", cell.id_text, failure.error().to_string());
      return;
    }
    Context cx(*self, cell.id, std::string(), nullptr);
    Status st = cell.actor->supervise(*failure, cx);
    if (!st) fail(cell, std::move(st.error()));
  }

  void construct(Cell& cell, wire::Envelope&& spawn_msg) {
    Context cx(*self, cell.id, std::string(reply_port_of(spawn_msg)), nullptr);
    auto made = cell.factory(cx);
    cell.factory = nullptr;
    if (!made) {
      Error e = actor_error(ActorErrc::kActorFailed, cell.id.to_string(),
                            "failed in its constructor: " + made.error().message);
      if (cx.expects_reply()) cx.reply_error(e);
      fail(cell, std::move(e));
      return;
    }
    cell.actor = std::move(*made);
    {
      std::lock_guard lock(cell.mu);
      cell.state = Cell::State::kRunning;
    }
    if (cx.expects_reply()) cx.reply({});
  }

  // The actor refuses everything from now on; queued messages are answered with the cause.
  void fail(Cell& cell, Error cause) {
    std::deque<Item> refused;
    {
      std::lock_guard lock(cell.mu);
      if (cell.state == Cell::State::kFailed || cell.state == Cell::State::kStopped) return;
      cell.state = Cell::State::kFailed;
      if (!cause.is(ActorErrc::kActorFailed)) {
        cause = actor_error(ActorErrc::kActorFailed, cell.id.to_string(),
                            "failed: " + cause.to_string());
      }
      cell.cause = cause;
      refused.swap(cell.queue);
    }
    spdlog::error("podium: {}", cause.message);
    {
      std::unique_lock lock(cells_mu);
      gone[cell.key] = cause;
      cells.erase(cell.key);
    }
    for (auto& it : refused) refuse(std::move(it), cause);
    report_failure(cell, cause);
  }

  // SV-1: the owner's process learns of the failure, once (fail() runs once per actor).
  void report_failure(Cell& cell, const Error& cause) {
    std::string supervisor;
    uint64_t supervision_id = 0;
    {
      std::lock_guard lock(cell.mu);
      supervisor = cell.supervisor;
      supervision_id = cell.supervision_id;
    }
    if (supervisor.empty()) return;
    auto addr = channel::Address::parse(supervisor);
    if (!addr) {
      spdlog::error("podium: {}: bad supervisor address '{}'", cell.id_text, supervisor);
      return;
    }
    MeshFailure f;
    f.kind = MeshFailure::Kind::kActor;
    f.actor_id = cell.id_text;
    f.host = host_name();
    f.pid = ::getpid();
    f.cause = cause.message;
    // The cause names the actor already ("<actor id>: ..." or "<actor id> failed: ...").
    for (std::string_view prefix : {std::string_view(": "), std::string_view(" failed: ")}) {
      std::string head = cell.id_text + std::string(prefix);
      if (f.cause.starts_with(head)) {
        f.cause.erase(0, head.size());
        break;
      }
    }
    wire::Envelope env;
    env.kind = static_cast<uint8_t>(MessageKind::kSystem);
    env.dest = PortId{ActorId{ProcId{*addr}, std::string(kSystemActorName), 0}, kMailboxPort}
                   .to_string();
    env.sender = cell.id_text;
    env.parts.push_back(encode_system_header(
        SystemHeader{"actor_failed", {}, {supervision_id, cell.id.index}}));
    env.parts.push_back(encode_mesh_failure(f));
    self->send(*addr, std::move(env));
  }

  void refuse(Item&& item, const Error& cause) {
    if (item.type == Item::Type::kFail) return;  // failed or stopped already
    if (item.type == Item::Type::kStop) {
      if (item.done) item.done(std::unexpected(cause));
    } else {
      bounce(std::move(item.env), cause);
    }
  }

  void stop_cell(Cell& cell, std::function<void(Status)> done) {
    if (cell.actor) {
      Context cx(*self, cell.id, std::string(), nullptr);
      cell.actor->cleanup(cx);
      cell.actor.reset();
    }
    Error cause = actor_error(ActorErrc::kActorStopped, cell.id.to_string(), "actor was stopped");
    std::deque<Item> refused;
    {
      std::lock_guard lock(cell.mu);
      cell.state = Cell::State::kStopped;
      cell.cause = cause;
      refused.swap(cell.queue);
    }
    {
      std::unique_lock lock(cells_mu);
      gone[cell.key] = cause;
      cells.erase(cell.key);
    }
    for (auto& it : refused) refuse(std::move(it), cause);
    if (done) done(ok());
  }

  // --- system port ---------------------------------------------------------------------

  void handle_system(wire::Envelope&& env) {
    if (env.kind != static_cast<uint8_t>(MessageKind::kSystem) || env.parts.empty()) {
      bounce(std::move(env), make_error(ActorErrc::kBadArguments,
                                        "system port of " + id.to_string() +
                                            " takes only system messages"));
      return;
    }
    auto h = decode_system_header(env.parts[0]);
    if (!h) {
      bounce(std::move(env), std::move(h.error()));
      return;
    }
    std::string reply(reply_port_of(env));
    if (h->op == "spawn") return system_spawn(*h, std::move(env));
    if (h->op == "adopt") return system_adopt(*h, reply);
    if (h->op == "stop" && h->args.size() == 1) {
      auto st = self->stop_actor(h->args[0], [this, reply](Status s) {
        if (reply.empty()) return;
        if (s) {
          self->send_reply(reply, 0, std::vector<Buffer>{});
        } else {
          self->send_reply(reply, 0, std::unexpected(s.error()));
        }
      });
      if (!st && !reply.empty()) self->send_reply(reply, 0, std::unexpected(st.error()));
      return;
    }
    if (h->op == "exit") {
      if (!reply.empty()) self->send_reply(reply, 0, std::vector<Buffer>{});
      exit_requested.set();
      return;
    }
    std::shared_ptr<SystemHandler> handler;
    {
      std::lock_guard lock(hooks_mu);
      if (holding) {
        held.push_back(std::move(env));
        return;
      }
      auto it = system_handlers.find(h->op);
      if (it != system_handlers.end()) handler = it->second;
    }
    if (handler) {
      (*handler)(*h, std::move(env));
      return;
    }
    bounce(std::move(env), make_error(ActorErrc::kBadArguments,
                                      "unknown system operation '" + h->op + "'"));
  }

  // "spawn" [type, name(, supervisor address)] [index(, supervision id)].
  void system_spawn(const SystemHeader& h, wire::Envelope&& env) {
    if (h.args.size() < 2 || h.args.size() > 3 || h.numbers.empty() || h.numbers.size() > 2 ||
        h.args.size() != h.numbers.size() + 1) {
      bounce(std::move(env), make_error(ActorErrc::kBadArguments,
                                        "spawn takes [type, name(, supervisor)] and "
                                        "[index(, supervision id)]"));
      return;
    }
    auto type = find_actor_type(h.args[0]);
    if (!type) {
      bounce(std::move(env), std::move(type.error()));
      return;
    }
    std::vector<Buffer> args(std::make_move_iterator(env.parts.begin() + 1),
                             std::make_move_iterator(env.parts.end()));
    ActorFactory factory = [type = std::move(*type), args = std::move(args)](Context& cx) mutable {
      return type(std::move(args), cx);
    };
    std::string supervisor = h.args.size() == 3 ? h.args[2] : std::string();
    uint64_t supervision_id = h.numbers.size() == 2 ? h.numbers[1] : 0;
    auto cell = make_cell(h.args[1], static_cast<uint32_t>(h.numbers[0]), std::move(factory),
                          std::move(supervisor), supervision_id);
    if (!cell) {
      bounce(std::move(env), std::move(cell.error()));
      return;
    }
    env.parts.clear();
    enqueue(*cell, Item{Item::Type::kConstruct, std::move(env), nullptr});
  }

  // "adopt" [name, supervisor address] [index, supervision id]: a new owner takes over the
  // supervision of the running actor name[index] (SV-5). Answered on the reply port: ok, or
  // why it cannot (no such actor, or it failed or stopped, with the cause).
  void system_adopt(const SystemHeader& h, const std::string& reply) {
    auto answer = [&](Result<std::vector<Buffer>> r) {
      if (!reply.empty()) self->send_reply(reply, 0, std::move(r));
    };
    if (h.args.size() != 2 || h.numbers.size() != 2 ||
        h.numbers[0] > std::numeric_limits<uint32_t>::max()) {
      return answer(std::unexpected(make_error(
          ActorErrc::kBadArguments, "adopt takes [name, supervisor] and [index, supervision id]")));
    }
    ActorId aid{id, h.args[0], static_cast<uint32_t>(h.numbers[0])};
    std::string key = aid.local_key();
    std::shared_ptr<Cell> cell;
    std::optional<Error> gone_why;
    {
      std::shared_lock lock(cells_mu);
      if (auto it = cells.find(key); it != cells.end()) {
        cell = it->second;
      } else if (auto g = gone.find(key); g != gone.end()) {
        gone_why = g->second;
      }
    }
    if (!cell) {
      if (gone_why) return answer(std::unexpected(*gone_why));
      return answer(std::unexpected(actor_error(ActorErrc::kNoSuchActor, aid.to_string(),
                                                "does not exist on this proc")));
    }
    {
      std::lock_guard lock(cell->mu);
      if (cell->state == Cell::State::kFailed || cell->state == Cell::State::kStopped) {
        return answer(std::unexpected(cell->cause));
      }
      cell->supervisor = h.args[1];
      cell->supervision_id = h.numbers[1];
    }
    answer(std::vector<Buffer>{});
  }

  Result<std::shared_ptr<Cell>> make_cell(std::string name, uint32_t index, ActorFactory factory,
                                          std::string supervisor = {},
                                          uint64_t supervision_id = 0) {
    if (auto st = ActorId::check_name(name); !st) return std::unexpected(st.error());
    if (name == kSystemActorName) {
      return std::unexpected(make_error(ActorErrc::kDuplicateActor,
                                        "the actor name 'proc' is reserved"));
    }
    auto cell = std::make_shared<Cell>();
    cell->id = ActorId{id, std::move(name), index};
    cell->key = cell->id.local_key();
    cell->id_text = cell->id.to_string();
    cell->factory = std::move(factory);
    cell->supervisor = std::move(supervisor);
    cell->supervision_id = supervision_id;
    std::unique_lock lock(cells_mu);
    if (cells.contains(cell->key)) {
      return std::unexpected(make_error(ActorErrc::kDuplicateActor,
                                        "actor " + cell->id.to_string() + " already exists"));
    }
    gone.erase(cell->key);
    cells.emplace(cell->key, cell);
    return cell;
  }
};

// ---------------------------------------------------------------------------------------

DeliveryOnlyScope::DeliveryOnlyScope()
    : outer_active_(tls_delivery_only), outer_deferred_(tls_deferred) {
  tls_delivery_only = true;
  tls_deferred = false;
}

DeliveryOnlyScope::~DeliveryOnlyScope() {
  tls_delivery_only = outer_active_;
  tls_deferred = outer_deferred_;
}

bool DeliveryOnlyScope::deferred() { return tls_deferred; }

void help_while_waiting() {
  HelpCandidate h = std::exchange(tls_help, HelpCandidate{});
  if (Executor::current()) return;
  auto life = h.life.lock();
  auto cell = std::static_pointer_cast<Proc::Impl::Cell>(h.cell.lock());
  if (!life || !cell) return;
  static_cast<Proc::Impl*>(h.proc)->drain(cell);
}

void Context::reply(std::vector<Buffer> value) {
  if (replied_ || reply_port_.empty()) return;
  replied_ = true;
  proc_.send_reply(reply_port_, rank(), std::move(value));
}

void Context::reply_error(Error error) {
  if (replied_ || reply_port_.empty()) return;
  replied_ = true;
  proc_.send_reply(reply_port_, rank(), std::unexpected(std::move(error)));
}

Proc::Proc() : impl_(std::make_unique<Impl>()) { impl_->self = this; }

Proc::~Proc() { stop(); }

Result<std::unique_ptr<Proc>> Proc::make(ProcConfig config) {
  std::unique_ptr<Proc> proc(new Proc());
  Impl* impl = proc->impl_.get();
  impl->holding = config.hold_system_ops;
  impl->net = std::make_unique<channel::Net>(
      impl->io, config.channel,
      [impl](wire::Envelope&& env) {
        impl->received_remote.fetch_add(1, std::memory_order_relaxed);
        tls_batch_proc = impl;
        impl->route(std::move(env));
      },
      [impl](wire::Envelope&& env, Error why) { impl->bounce(std::move(env), std::move(why)); });
  impl->net->on_batch_end([impl] {
    tls_batch_proc = nullptr;
    if (auto cell = std::static_pointer_cast<Impl::Cell>(std::exchange(tls_batch_cell, nullptr))) {
      impl->drain(cell);
    }
  });
  auto bound = impl->net->listen(config.listen);
  if (!bound) return std::unexpected(bound.error());
  impl->id = ProcId{*bound};
  impl->id_text = impl->id.to_string();
  impl->system_id = ActorId{impl->id, std::string(kSystemActorName), 0};
  impl->port_prefix = impl->system_id.to_string() + ":";
  impl->stream_salt = (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                      std::random_device{}() ^ static_cast<uint64_t>(::getpid());
  impl->proc_stream = impl->stream_hash(impl->id_text);
  impl->executor.start();
  return proc;
}

const ProcId& Proc::id() const { return impl_->id; }
asio::io_context& Proc::io() { return impl_->io; }
Executor& Proc::executor() { return impl_->executor; }

void Proc::send(const channel::Address& to, wire::Envelope env) {
  impl_->stamp(env);
  if (to == impl_->id.addr) {
    impl_->route(std::move(env));
  } else {
    impl_->sent_remote.fetch_add(1, std::memory_order_relaxed);
    impl_->net->send(to, std::move(env));
  }
}

uint64_t Proc::sender_stream() const {
  if (const std::string* me = current_actor_text()) return impl_->stream_hash(*me);
  return impl_->proc_stream;
}

uint64_t Proc::next_seq(uint64_t stream, std::string_view dest) {
  uint64_t out = 0;
  next_seqs(stream, std::span<const std::string* const>(), dest, &out);
  return out;
}

void Proc::next_seqs(uint64_t stream, std::span<const std::string* const> dests,
                     std::string_view one, uint64_t* out) {
  std::lock_guard lock(impl_->order_mu);
  auto& per_dest = impl_->order_out[stream];
  auto bump = [&](std::string_view d) {
    auto it = per_dest.find(d);
    if (it == per_dest.end()) {
      auto block = Impl::new_counters(1);
      it = per_dest.emplace(std::string(d), Impl::Counter{block.get(), block}).first;
    }
    return ++*it->second.value;
  };
  if (dests.empty()) {
    *out = bump(one);
    return;
  }
  for (size_t i = 0; i < dests.size(); ++i) out[i] = bump(*dests[i]);
}

Proc::SeqSlots Proc::seq_slots(uint64_t stream, std::span<const std::string* const> dests) {
  SeqSlots out;
  out.slots.reserve(dests.size());
  std::lock_guard lock(impl_->order_mu);
  auto& per_dest = impl_->order_out[stream];
  size_t missing = 0;
  for (const std::string* d : dests) missing += per_dest.contains(*d) ? 0 : 1;
  auto block = missing ? Impl::new_counters(missing) : nullptr;
  uint64_t* next = block.get();
  for (const std::string* d : dests) {
    auto it = per_dest.find(*d);
    if (it == per_dest.end()) {  // a dest listed twice gets one counter
      it = per_dest.emplace(*d, Impl::Counter{next++, block}).first;
    }
    out.slots.push_back(it->second.value);
    if (out.blocks.empty() || out.blocks.back() != it->second.block) {
      out.blocks.push_back(it->second.block);
    }
  }
  return out;
}

void Proc::forget_dests(std::span<const std::string> proc_keys) {
  if (proc_keys.empty()) return;
  std::unordered_set<std::string_view> gone(proc_keys.begin(), proc_keys.end());
  std::lock_guard lock(impl_->order_mu);
  for (auto it = impl_->order_out.begin(); it != impl_->order_out.end();) {
    std::erase_if(it->second, [&](const auto& kv) {
      std::string_view dest = kv.first;  // "<proc>#<actor>:<port>"
      auto hash = dest.rfind('#');
      return hash != std::string_view::npos && gone.contains(dest.substr(0, hash));
    });
    it = it->second.empty() ? impl_->order_out.erase(it) : std::next(it);
  }
}

void Proc::next_seqs(std::span<uint64_t* const> slots, uint64_t* out) {
  std::lock_guard lock(impl_->order_mu);
  for (size_t i = 0; i < slots.size(); ++i) out[i] = ++*slots[i];
}

void Proc::forget_peer(const channel::Address& peer, const std::string& why) {
  if (impl_->net) impl_->net->forget(peer, why);
}

size_t Proc::link_count() const { return impl_->net ? impl_->net->link_count() : 0; }

Proc::Traffic Proc::traffic() const {
  return Traffic{impl_->sent_remote.load(std::memory_order_relaxed),
                 impl_->received_remote.load(std::memory_order_relaxed)};
}

void Proc::send(wire::Envelope env) {
  impl_->stamp(env);
  auto v = split_port_id(env.dest);
  if (!v) {
    impl_->bounce(std::move(env), v.error());
    return;
  }
  if (v->addr == impl_->id_text) {
    impl_->route(std::move(env));
    return;
  }
  // Replies go to few distinct procs; remember the last address parsed on this thread.
  thread_local std::string last_text;
  thread_local channel::Address last_addr;
  if (v->addr != last_text) {
    auto addr = channel::Address::parse(v->addr);
    if (!addr) {
      impl_->bounce(std::move(env), addr.error());
      return;
    }
    last_text.assign(v->addr);
    last_addr = std::move(*addr);
  }
  impl_->sent_remote.fetch_add(1, std::memory_order_relaxed);
  impl_->net->send(last_addr, std::move(env));
}

void Proc::send_reply(std::string_view reply_port, uint64_t rank,
                      Result<std::vector<Buffer>> value) {
  wire::Envelope env;
  env.kind = static_cast<uint8_t>(MessageKind::kReply);
  env.dest.assign(reply_port);
  if (const std::string* me = current_actor_text()) env.sender = *me;
  ReplyHeader h;
  h.rank = rank;
  h.ok = value.has_value();
  if (value) {
    env.parts.reserve(value->size() + 1);
    env.parts.push_back(Buffer());
    for (auto& b : *value) env.parts.push_back(std::move(b));
  } else {
    h.error = std::move(value.error());
    env.parts.push_back(Buffer());
  }
  env.parts[0] = encode_reply_header(h);
  send(std::move(env));
}

Result<ActorId> Proc::spawn(std::string name, uint32_t index, ActorFactory factory) {
  auto cell = impl_->make_cell(std::move(name), index, std::move(factory));
  if (!cell) return std::unexpected(cell.error());
  ActorId id = (*cell)->id;
  impl_->enqueue(*cell, Impl::Item{Impl::Item::Type::kConstruct, wire::Envelope{}, nullptr});
  return id;
}

Status Proc::stop_actor(std::string_view local_key, std::function<void(Status)> done) {
  std::shared_ptr<Impl::Cell> cell;
  {
    std::shared_lock lock(impl_->cells_mu);
    auto it = impl_->cells.find(local_key);
    if (it == impl_->cells.end()) {
      auto g = impl_->gone.find(local_key);
      if (g != impl_->gone.end()) return std::unexpected(g->second);
      return std::unexpected(make_error(ActorErrc::kNoSuchActor,
                                        "no actor '" + std::string(local_key) + "' in proc " +
                                            impl_->id.to_string()));
    }
    cell = it->second;
  }
  impl_->enqueue(cell, Impl::Item{Impl::Item::Type::kStop, wire::Envelope{}, std::move(done)});
  return ok();
}

void Proc::fail_actor(std::string_view local_key, Error cause) {
  std::shared_ptr<Impl::Cell> cell;
  {
    std::shared_lock lock(impl_->cells_mu);
    auto it = impl_->cells.find(local_key);
    if (it == impl_->cells.end()) return;  // already stopped or failed
    cell = it->second;
  }
  Impl::Item item;
  item.type = Impl::Item::Type::kFail;
  item.cause = std::move(cause);
  impl_->enqueue(cell, std::move(item));
}

PortId Proc::open_port(PortHandler handler, bool once) {
  uint64_t port = impl_->next_port.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard lock(impl_->ports_mu);
    // Once stopped, no port is served (AC-13): the handler is dropped on the way out.
    if (!impl_->stopped.load()) {
      impl_->ports.emplace(port, Impl::PortEntry{
                                     std::make_shared<PortHandler>(std::move(handler)), once});
    }
  }
  return PortId{impl_->system_id, port};
}

std::string Proc::port_text(uint64_t port) const {
  std::string out = impl_->port_prefix;
  out += std::to_string(port);
  return out;
}

void Proc::close_port(uint64_t port) {
  std::shared_ptr<PortHandler> dropped;  // destroyed outside the lock
  std::lock_guard lock(impl_->ports_mu);
  auto it = impl_->ports.find(port);
  if (it == impl_->ports.end()) return;
  dropped = std::move(it->second.handler);
  impl_->ports.erase(it);
}

void Proc::on_system(std::string op, SystemHandler handler) {
  std::lock_guard lock(impl_->hooks_mu);
  impl_->system_handlers[std::move(op)] = std::make_shared<SystemHandler>(std::move(handler));
}

void Proc::serve_held_system_ops() {
  std::vector<wire::Envelope> held;
  {
    std::lock_guard lock(impl_->hooks_mu);
    impl_->holding = false;
    held.swap(impl_->held);
  }
  for (auto& env : held) impl_->handle_system(std::move(env));
}

void Proc::on_undeliverable(UndeliverableHook hook) {
  std::lock_guard lock(impl_->hooks_mu);
  impl_->undeliverable_hook = std::make_shared<UndeliverableHook>(std::move(hook));
}

bool Proc::wait_exit_requested(std::chrono::nanoseconds timeout) {
  return impl_->exit_requested.wait_for(timeout);
}

void Proc::request_exit() { impl_->exit_requested.set(); }

void Proc::stop() {
  if (impl_->stopped.exchange(true)) return;
  impl_->exit_requested.set();
  if (impl_->net) impl_->net->stop();
  impl_->executor.stop();
  {
    std::unique_lock lock(impl_->cells_mu);
    impl_->cells.clear();
  }
  // Nothing will be delivered to a port any more: their handlers go now, while the program
  // still runs, rather than in a destructor at exit. A handler that owns a reply's promise
  // abandons it, so whoever waits on it hears `kCancelled` (AC-13).
  std::unordered_map<uint64_t, Impl::PortEntry> ports;
  {
    std::lock_guard lock(impl_->ports_mu);
    ports.swap(impl_->ports);
  }
}

}  // namespace podium::actor
