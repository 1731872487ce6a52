// The actor layer's messages: what goes into wire::Envelope::kind, headers and part 0.
//
//   kCall    dest = actor mailbox (port 0). parts[0] = CallHeader, parts[1..] = arguments
//            (msgpack tuple for C++ actors, pickle + out-of-band buffers for Python ones).
//            Header "reply" = PortId that receives the kReply, absent for one-way sends.
//   kReply   dest = a port. parts[0] = ReplyHeader, parts[1..] = the value when ok.
//   kSystem  dest = a proc's system port ("proc[0]:0"). parts[0] = SystemHeader,
//            parts[1..] = operation payload (constructor arguments for "spawn").
//   kPort    dest = a port. parts = the value sent with Port::send.
//   kSupervise dest = an actor mailbox (port 0): a mesh that the actor owns failed.
//            parts[0] = MeshFailure (mesh_failure.h). Handled by ActorBase::supervise.
//
// An envelope that cannot be delivered and carries a "reply" header is answered with a kReply
// whose error says why, so a waiting caller learns of it at once.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "podium/actor/ids.h"
#include "podium/base/buffer.h"
#include "podium/base/error.h"
#include "podium/wire/envelope.h"

namespace podium::actor {

enum class MessageKind : uint8_t { kCall = 1, kReply = 2, kSystem = 3, kPort = 4, kSupervise = 5 };

inline constexpr std::string_view kReplyHeader = "reply";
inline constexpr std::string_view kSystemActorName = "proc";

struct CallHeader {
  std::string endpoint;
  uint64_t rank = 0;                // the receiver's rank within the cast's region
  std::vector<std::string> labels;  // the cast region's extent
  std::vector<uint64_t> sizes;
};

struct ReplyHeader {
  uint64_t rank = 0;  // which member of a cast replied
  bool ok = true;
  Error error;        // when !ok
};

struct SystemHeader {
  std::string op;                  // "spawn", "stop", "exit", or a registered extension
  std::vector<std::string> args;   // op-specific strings
  std::vector<uint64_t> numbers;   // op-specific integers
};

[[nodiscard]] Buffer encode_call_header(const CallHeader& h);
// The same bytes, without building a CallHeader (the cast hot path).
[[nodiscard]] Buffer encode_call_header(std::string_view endpoint, uint64_t rank,
                                        const std::vector<std::string>& labels,
                                        const std::vector<size_t>& sizes);
[[nodiscard]] Result<CallHeader> decode_call_header(const Buffer& b);
[[nodiscard]] Buffer encode_reply_header(const ReplyHeader& h);
[[nodiscard]] Result<ReplyHeader> decode_reply_header(const Buffer& b);
[[nodiscard]] Buffer encode_system_header(const SystemHeader& h);
// A one-way kSystem message `h` from the system actor of the proc `from` to that of the proc
// `to`. Its sender is `from`'s system actor (system_sender), so a receiver can check who sent
// an operation it accepts from one peer only (a host agent's kills: mesh/host_agent.h).
[[nodiscard]] wire::Envelope system_message(const ProcId& from, const ProcId& to,
                                            const SystemHeader& h);
// The sender text of system messages from `proc`: its system actor, "ADDR#proc[0]".
[[nodiscard]] std::string system_sender(const ProcId& proc);
// The proc whose system actor sent a message with sender text `sender`; an error when the
// sender is empty, does not parse, or is not a system actor.
[[nodiscard]] Result<ProcId> system_sender_proc(std::string_view sender);
[[nodiscard]] Result<SystemHeader> decode_system_header(const Buffer& b);

// The value of the "reply" header, or empty.
std::string_view reply_port_of(const wire::Envelope& env);

}  // namespace podium::actor
