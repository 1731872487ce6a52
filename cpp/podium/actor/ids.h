// Actor-layer identities. A ProcId is the proc's channel Address, so every ActorId and PortId
// routes to its proc with no directory lookup.
//
// Text forms (what travels in wire::Envelope::dest / sender):
//   ProcId   unix:/run/podium-0/job/p3.sock
//   ActorId  unix:/run/podium-0/job/p3.sock#counter[0]
//   PortId   unix:/run/podium-0/job/p3.sock#counter[0]:7
// Actor names may not contain '#', '[', ']' or ':'; parsing splits at the last '#'.
#pragma once

#include <compare>
#include <cstdint>
#include <string>
#include <string_view>

#include "podium/base/error.h"
#include "podium/channel/address.h"

namespace podium::actor {

enum class ActorErrc : uint16_t {
  kBadId = 100,
  kNoSuchActor = 101,
  kNoSuchPort = 102,
  kNoSuchEndpoint = 103,
  kBadArguments = 104,
  kHandlerFailed = 105,
  kUnknownActorType = 106,
  kDuplicateActor = 107,
  kActorStopped = 108,
  kActorFailed = 109,
  kProcStopped = 110,
  kTimeout = 111,
  kUndeliverable = 112,
  kProcExited = 113,
};
constexpr Subsystem subsystem_of(ActorErrc) { return Subsystem::kActor; }

struct ProcId {
  channel::Address addr;

  std::string to_string() const { return addr.to_string(); }
  auto operator<=>(const ProcId&) const = default;
};

struct ActorId {
  ProcId proc;
  std::string name;
  uint32_t index = 0;

  // The part after '#': "counter[0]"; unique within its proc.
  std::string local_key() const;
  std::string to_string() const;
  [[nodiscard]] static Result<ActorId> parse(std::string_view text);
  [[nodiscard]] static Status check_name(std::string_view name);
  auto operator<=>(const ActorId&) const = default;
};

// Port 0 of an actor is its mailbox (endpoint calls); other numbers are ports it opened.
inline constexpr uint64_t kMailboxPort = 0;

struct PortId {
  ActorId actor;
  uint64_t port = kMailboxPort;

  std::string to_string() const;
  [[nodiscard]] static Result<PortId> parse(std::string_view text);
  auto operator<=>(const PortId&) const = default;
};

// Splits "ADDR#name[i]:port" without allocating: the address text, the local key and the port.
struct PortIdView {
  std::string_view addr;
  std::string_view local_key;
  uint64_t port = 0;
};
[[nodiscard]] Result<PortIdView> split_port_id(std::string_view text);

}  // namespace podium::actor
