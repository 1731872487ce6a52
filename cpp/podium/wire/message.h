// podium::wire messages — what the frames of a channel link mean (docs/wire.md).
//
// A link is one connection in one direction: the dialling side sends Hello, then Data frames;
// the accepting side answers on the same socket with HelloAck, then cumulative Acks.
// Each message's fields travel in the frame's msgpack header as one array; a Data frame's
// parts are the envelope's parts.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "podium/base/error.h"
#include "podium/wire/envelope.h"
#include "podium/wire/frame.h"

namespace podium::wire {

// Version of the session protocol carried in Hello; a receiver refuses any other.
inline constexpr uint32_t kSessionProtocolVersion = 1;

// First frame of a connection. `session_id` names the sending link's incarnation: sequence
// numbers and de-duplication are per session, so they survive reconnects.
struct Hello {
  uint32_t protocol_version = kSessionProtocolVersion;
  uint64_t session_id = 0;
  std::string listen_address;  // the sender's own address, for logs
  // The address this connection's envelopes are for, when it is not the listener itself: a
  // proc's address with an incarnation (a gateway routes it when it names a client attached
  // through it), or a client's forward through its gateway (docs/channel.md, "Gateways").
  // "": the listener. Encoded only when set, with `flags`.
  std::string to;
  uint32_t flags = 0;  // kHelloReverse
};
// Hello::flags: this connection is a client's duplex to its gateway (GW-1): the dialler
// becomes the receiver, the listener sends its Hello and Data back on it.
inline constexpr uint32_t kHelloReverse = 1;

// Answer to Hello: the highest seq the receiver has delivered in this session (0: none).
struct HelloAck {
  uint64_t delivered_seq = 0;
};

// One envelope; seqs increase within a session (gaps are allowed).
struct Data {
  uint64_t seq = 0;
  Envelope envelope;
};

// Every seq up to and including `seq` has been delivered.
struct Ack {
  uint64_t seq = 0;
};

using Message = std::variant<Hello, HelloAck, Data, Ack>;

// Each appends one frame head to `out` (HeadWriter). For Data the frame continues with
// `env.parts`, which the caller writes from their own memory (WI-1).
void encode(const Hello& m, std::vector<std::byte>& out);
void encode(const HelloAck& m, std::vector<std::byte>& out);
void encode(const Ack& m, std::vector<std::byte>& out);
void encode_data(uint64_t seq, const Envelope& env, std::vector<std::byte>& out);

// An upper bound on the bytes of `env`'s Data frame, to refuse it before queueing; with
// `header_bound`, also one on its msgpack header alone (WI-5).
size_t data_frame_bound(const Envelope& env, size_t* header_bound = nullptr);

// Decodes a frame's header (and moves its parts into a Data envelope).
[[nodiscard]] Result<Message> decode(RawFrame&& frame);

}  // namespace podium::wire
