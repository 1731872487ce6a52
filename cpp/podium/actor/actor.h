// podium::actor::ActorBase and Context — what every actor implements and sees.
//
// An actor lives in one proc and handles one message at a time, in arrival order (AC-6). Its
// factory runs as the first item of its mailbox, so construction happens before any message
// and on the actor's own turn, never on the sender's thread. Typed C++ actors (typed.h) and
// Python actors (bindings) both implement ActorBase.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "podium/actor/ids.h"
#include "podium/actor/mesh_failure.h"
#include "podium/actor/message.h"
#include "podium/base/buffer.h"
#include "podium/base/error.h"
#include "podium/wire/envelope.h"

namespace podium::actor {

class Proc;

// The handler's view of the message being handled. Valid only during the handler call.
class Context {
 public:
  Context(Proc& proc, const ActorId& self, std::string reply_port, const CallHeader* call)
      : proc_(proc), self_(self), reply_port_(std::move(reply_port)), call_(call) {}

  Proc& proc() const { return proc_; }
  const ActorId& self() const { return self_; }
  // The call being handled, or nullptr for other kinds.
  const CallHeader* call() const { return call_; }
  uint64_t rank() const { return call_ ? call_->rank : 0; }
  bool expects_reply() const { return !reply_port_.empty(); }

  // Answers the message's reply port (no-op for one-way messages). At most once.
  void reply(std::vector<Buffer> value);
  void reply_error(Error error);
  bool replied() const { return replied_; }
  // Takes over the duty to answer: returns the reply port (empty for a one-way message) and
  // marks the message answered, so the runtime sends nothing when the handler returns. The
  // taker answers later, from any thread, with Proc::send_reply(port, rank(), ...). For
  // handlers that finish on a thread of their own (Python actors).
  std::string take_reply() {
    replied_ = true;
    return std::exchange(reply_port_, std::string());
  }

 private:
  Proc& proc_;
  const ActorId& self_;
  std::string reply_port_;
  const CallHeader* call_;
  bool replied_ = false;
};

class ActorBase {
 public:
  virtual ~ActorBase() = default;
  // Handles one message. A message that expects a reply and returns without one is answered
  // with an error by the runtime, so no caller waits forever. Returning an Error fails the
  // actor: later messages are refused with that cause.
  virtual Status handle(wire::Envelope&& msg, Context& cx) = 0;
  // Runs once when the actor is stopped, after the messages queued before the stop.
  virtual void cleanup(Context&) {}
  // A mesh that this actor spawned (it is the mesh's owner) failed. Returning ok means handled
  // (or, for actors that finish on a thread of their own, that the decision is theirs: they
  // fail themselves with Proc::fail_actor when they do not handle it). Returning an Error fails
  // this actor, which reports that to its own owner. The default handles nothing.
  virtual Status supervise(const MeshFailure& failure, Context&) {
    return std::unexpected(make_error(ActorErrc::kActorFailed,
                                      "unhandled failure of a mesh it owns: " + failure.report()));
  }
};

using ActorFactory = std::function<Result<std::unique_ptr<ActorBase>>(Context&)>;

// Spawnable actor types, by name, for "spawn" system messages from other procs.
// `args` are the spawn message's payload parts. Registration is thread-safe.
using TypeFactory =
    std::function<Result<std::unique_ptr<ActorBase>>(std::vector<Buffer> args, Context&)>;
void register_actor_type(std::string name, TypeFactory factory);
[[nodiscard]] Result<TypeFactory> find_actor_type(std::string_view name);

}  // namespace podium::actor
