#include "podium/actor/port_receiver.h"

#include <optional>
#include <utility>

#include "podium/actor/message.h"
#include "podium/actor/proc.h"

namespace podium::actor {
namespace {

// The value of a kPort (its parts) or of a kReply (after its header: the value or the error).
Result<std::vector<Buffer>> message_of(wire::Envelope&& env) {
  if (env.kind != static_cast<uint8_t>(MessageKind::kReply)) return std::move(env.parts);
  if (env.parts.empty()) {
    return std::unexpected(
        make_error(ActorErrc::kBadArguments, "reply from " + env.sender + " has no header"));
  }
  auto h = decode_reply_header(env.parts[0]);
  if (!h) return std::unexpected(std::move(h.error()));
  if (!h->ok) return std::unexpected(std::move(h->error));
  env.parts.erase(env.parts.begin());
  return std::move(env.parts);
}

}  // namespace

PortReceiver::PortReceiver(Proc& proc, bool once)
    : proc_(proc), st_(std::make_shared<State>()) {
  port_ = proc_.open_port(
      [st = st_](wire::Envelope&& env) { deliver(*st, message_of(std::move(env))); }, once);
}

PortReceiver::~PortReceiver() { close(); }

Future<std::vector<Buffer>> PortReceiver::recv() {
  Promise<std::vector<Buffer>> p;
  auto out = p.future();
  std::optional<Result<std::vector<Buffer>>> item;
  {
    std::lock_guard lock(st_->mu);
    if (!st_->items.empty()) {
      item = std::move(st_->items.front());
      st_->items.pop_front();
    } else if (st_->closed) {
      item = std::unexpected(
          make_error(ActorErrc::kNoSuchPort, "the receiver of " + port_id() + " is closed"));
    } else {
      st_->waiters.push_back(std::move(p));
      return out;
    }
  }
  p.set(std::move(*item));
  return out;
}

void PortReceiver::close() {
  std::deque<Promise<std::vector<Buffer>>> waiters;
  {
    std::lock_guard lock(st_->mu);
    if (st_->closed) return;
    st_->closed = true;
    waiters.swap(st_->waiters);
  }
  proc_.close_port(port_.port);
  for (auto& w : waiters) {
    w.set(std::unexpected(
        make_error(ActorErrc::kNoSuchPort, "the receiver of " + port_id() + " was closed")));
  }
}

void PortReceiver::deliver(State& st, Result<std::vector<Buffer>> message) {
  Promise<std::vector<Buffer>> waiter;
  {
    std::lock_guard lock(st.mu);
    if (st.closed) return;
    if (st.waiters.empty()) {
      st.items.push_back(std::move(message));
      return;
    }
    waiter = std::move(st.waiters.front());
    st.waiters.pop_front();
  }
  waiter.set(std::move(message));
}

void send_to_port(Proc& from, std::string port, std::vector<Buffer> parts) {
  wire::Envelope env;
  env.kind = static_cast<uint8_t>(MessageKind::kPort);
  env.dest = std::move(port);
  env.parts = std::move(parts);
  from.send(std::move(env));
}

}  // namespace podium::actor
