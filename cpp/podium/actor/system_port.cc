// Proc::Impl's system port, "<proc>#proc[0]:0": the operations a proc serves for its peers.
//   spawn [type, name(, supervisor)] [index(, supervision id)]  creates an actor (SV-1)
//   adopt [name, supervisor] [index, supervision id]            supervision.cc (SV-5)
//   stop [local key]                                            AC-9, answered once done
//   exit                                                        wait_exit_requested() wakes
// Any other operation goes to the handler registered for it (Proc::on_system), is held while
// ProcConfig::hold_system_ops holds (until serve_held_system_ops()), or is refused (AC-8).
//
// Threads: runs on the thread that delivers the message (a runner, or a local sender);
// hooks_mu guards the handler table and the held operations.
#include "podium/actor/proc_impl.h"

namespace podium::actor {

void Proc::Impl::handle_system(wire::Envelope&& env) {
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
void Proc::Impl::system_spawn(const SystemHeader& h, wire::Envelope&& env) {
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

}  // namespace podium::actor
