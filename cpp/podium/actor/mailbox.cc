// Proc::Impl's mailboxes (mailbox.h): queueing, draining, and an actor's construct, stop and
// failure. AC-6, AC-8, AC-9, AC-10 (proc.h, drive.h); AC-18 (proc.h): the table of ended
// actors is bounded.
#include <spdlog/spdlog.h>

#include <asio/post.hpp>

#include "podium/actor/proc_impl.h"

namespace podium::actor {

void Proc::Impl::enqueue(const std::shared_ptr<Mailbox>& cell, Item&& item) {
  std::unique_lock lock(cell->mu);
  if (item.type == Item::Type::kMessage && cell->ended()) {
    Error e = cell->cause;
    lock.unlock();
    bounce(std::move(item.env), std::move(e));
    return;
  }
  cell->queue.push_back(std::move(item));
  if (cell->scheduled) return;
  cell->scheduled = true;
  lock.unlock();
  auto& tls = internal::drive_tls();
  if (tls.batch_proc == this && !tls.batch_cell) {
    tls.batch_cell = cell;
    return;
  }
  if (!Executor::current()) {
    // A thread outside the runtime (a controller's main thread) that waits for the answer
    // right after sending may run this drain itself (help_while_waiting, AC-17).
    tls.help = internal::HelpCandidate{help_gate, this, &Impl::drain_for_helper, cell};
  }
  asio::post(io, [this, cell] { drain(cell); });
}

void Proc::Impl::drain_for_helper(void* impl, const std::shared_ptr<void>& mailbox) {
  static_cast<Impl*>(impl)->drain(std::static_pointer_cast<Mailbox>(mailbox));
}

// Runs the mailbox's queued items. Whoever gets here first (the posted drain on a runner, or
// a waiting caller helping) drains; the other finds it running or empty and returns.
void Proc::Impl::drain(const std::shared_ptr<Mailbox>& cell) {
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
  auto& tls = internal::drive_tls();
  bool more = true;
  {
    internal::ActorScope scope(&cell->id, &cell->id_text, cell->stream);
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
        if (tls.delivery_only && cell->queue.front().type != Item::Type::kMessage) {
          tls.deferred = true;
          break;
        }
        item = std::move(cell->queue.front());
        cell->queue.pop_front();
      }
      process(*cell, std::move(item));
    }
  }
  executor.handler_end();
  if (more) {
    {
      std::lock_guard lock(cell->mu);
      cell->running = false;
    }
    asio::post(io, [this, cell] { drain(cell); });
  }
}

void Proc::Impl::process(Mailbox& cell, Item&& item) {
  switch (item.type) {
    case Item::Type::kConstruct: return construct(cell, std::move(item.env));
    case Item::Type::kStop: return stop_cell(cell, std::move(item.done));
    case Item::Type::kFail: return fail(cell, std::move(item.cause));
    case Item::Type::kMessage: break;
  }
  {
    std::unique_lock lock(cell.mu);
    if (cell.state != Mailbox::State::kRunning) {
      Error cause = cell.cause;
      lock.unlock();
      bounce(std::move(item.env), std::move(cause));
      return;
    }
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

void Proc::Impl::construct(Mailbox& cell, wire::Envelope&& spawn_msg) {
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
    cell.state = Mailbox::State::kRunning;
  }
  if (cx.expects_reply()) cx.reply({});
}

// The actor refuses everything from now on; queued messages are answered with the cause.
void Proc::Impl::fail(Mailbox& cell, Error cause) {
  std::deque<Item> refused;
  {
    std::lock_guard lock(cell.mu);
    if (cell.ended()) return;
    cell.state = Mailbox::State::kFailed;
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
    ended_locked(cell, cause);
  }
  seqs.forget_stream(cell.stream);  // AC-16: this incarnation never sends again
  for (auto& it : refused) refuse(std::move(it), cause);
  report_failure(cell, cause);
}

void Proc::Impl::refuse(Item&& item, const Error& cause) {
  if (item.type == Item::Type::kFail) return;  // failed or stopped already
  if (item.type == Item::Type::kStop) {
    if (item.done) item.done(std::unexpected(cause));
  } else {
    bounce(std::move(item.env), cause);
  }
}

void Proc::Impl::stop_cell(Mailbox& cell, std::function<void(Status)> done) {
  if (cell.actor) {
    Context cx(*self, cell.id, std::string(), nullptr);
    cell.actor->cleanup(cx);
    cell.actor.reset();
  }
  Error cause = actor_error(ActorErrc::kActorStopped, cell.id.to_string(), "actor was stopped");
  std::deque<Item> refused;
  {
    std::lock_guard lock(cell.mu);
    cell.state = Mailbox::State::kStopped;
    cell.cause = cause;
    refused.swap(cell.queue);
  }
  {
    std::unique_lock lock(cells_mu);
    ended_locked(cell, cause);
  }
  seqs.forget_stream(cell.stream);  // AC-16
  for (auto& it : refused) refuse(std::move(it), cause);
  if (done) done(ok());
}

// AC-18: the actor leaves the table; its cause is kept among the last ended_kept.
void Proc::Impl::ended_locked(Mailbox& cell, const Error& cause) {
  auto it = cells.find(cell.key);
  if (it != cells.end() && it->second.get() == &cell) cells.erase(it);
  if (ended_kept == 0) return;
  auto [pos, inserted] = ended.insert_or_assign(cell.key, cause);
  if (inserted) ended_order.push_back(cell.key);
  while (ended.size() > ended_kept && !ended_order.empty()) {
    ended.erase(ended_order.front());
    ended_order.pop_front();
  }
}

std::shared_ptr<Mailbox> Proc::Impl::find(std::string_view local_key, std::optional<Error>* why) {
  std::shared_lock lock(cells_mu);
  if (auto it = cells.find(local_key); it != cells.end()) return it->second;
  if (why) {
    if (auto g = ended.find(local_key); g != ended.end()) *why = g->second;
  }
  return nullptr;
}

Result<std::shared_ptr<Mailbox>> Proc::Impl::make_cell(std::string name, uint32_t index,
                                                      ActorFactory factory,
                                                      std::string supervisor,
                                                      uint64_t supervision_id) {
  if (auto st = ActorId::check_name(name); !st) return std::unexpected(st.error());
  if (name == kSystemActorName) {
    return std::unexpected(make_error(ActorErrc::kDuplicateActor,
                                      "the actor name 'proc' is reserved"));
  }
  auto cell = std::make_shared<Mailbox>();
  cell->id = ActorId{id, std::move(name), index};
  cell->key = cell->id.local_key();
  cell->id_text = cell->id.to_string();
  // AC-16: each incarnation its own stream, so that its counters can go with it.
  cell->stream = stream_hash(cell->id_text + '\n' +
                             std::to_string(incarnations.fetch_add(1, std::memory_order_relaxed)));
  cell->factory = std::move(factory);
  cell->supervisor = std::move(supervisor);
  cell->supervision_id = supervision_id;
  std::unique_lock lock(cells_mu);
  if (cells.contains(cell->key)) {
    return std::unexpected(make_error(ActorErrc::kDuplicateActor,
                                      "actor " + cell->id.to_string() + " already exists"));
  }
  // An entry in `ended` under this key stays: cells is looked up first, and when this one
  // ends its cause replaces the old one in place (one ended_order entry per key).
  cells.emplace(cell->key, cell);
  return cell;
}

}  // namespace podium::actor
