// Proc::Impl's side of supervision: a failed actor's report to its owner (SV-1), an owner's
// mesh failure handed to the actor that owns the mesh, and a new owner's "adopt" (SV-5).
// The invariants are stated in proc.h; the controller's side is in the mesh layer.
//
// Threads: report_failure() and supervise() run on the thread that drains the actor's
// mailbox; system_adopt() on the thread that delivers the system message. The supervisor
// fields are read and written under the Mailbox's mu.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <limits>

#include "podium/actor/mesh_failure.h"
#include "podium/actor/proc_impl.h"

namespace podium::actor {

// A mesh this actor owns failed: the actor handles it, or fails itself.
void Proc::Impl::supervise(Mailbox& cell, wire::Envelope&& env) {
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

// SV-1: the owner's process learns of the failure, once (fail() runs once per actor).
void Proc::Impl::report_failure(Mailbox& cell, const Error& cause) {
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

// "adopt" [name, supervisor address] [index, supervision id]: a new owner takes over the
// supervision of the running actor name[index] (SV-5). Answered on the reply port: ok, or
// why it cannot (no such actor, or it failed or stopped, with the cause).
void Proc::Impl::system_adopt(const SystemHeader& h, const std::string& reply) {
  auto answer = [&](Result<std::vector<Buffer>> r) {
    if (!reply.empty()) self->send_reply(reply, 0, std::move(r));
  };
  if (h.args.size() != 2 || h.numbers.size() != 2 ||
      h.numbers[0] > std::numeric_limits<uint32_t>::max()) {
    return answer(std::unexpected(make_error(
        ActorErrc::kBadArguments, "adopt takes [name, supervisor] and [index, supervision id]")));
  }
  ActorId aid{id, h.args[0], static_cast<uint32_t>(h.numbers[0])};
  std::optional<Error> gone_why;
  auto cell = find(aid.local_key(), &gone_why);
  if (!cell) {
    if (gone_why) return answer(std::unexpected(*gone_why));
    return answer(std::unexpected(actor_error(ActorErrc::kNoSuchActor, aid.to_string(),
                                              "does not exist on this proc")));
  }
  {
    std::lock_guard lock(cell->mu);
    if (cell->ended()) return answer(std::unexpected(cell->cause));
    cell->supervisor = h.args[1];
    cell->supervision_id = h.numbers[1];
  }
  answer(std::vector<Buffer>{});
}

}  // namespace podium::actor
