// podium::wire messages — what the frames of a channel link mean (docs/wire.md).
//
// A link is one connection in one direction: the dialling side sends Hello, then Data frames;
// the accepting side answers on the same socket with HelloAck, then cumulative Acks.
// Each message's fields travel in the frame's msgpack header as one array; a Data frame's
// parts are the envelope's parts.
//
// Invariants (tests name them):
//   WI-8 A lent part's bytes are not in its frame: its table entry is 0 and the Data header's
//        eighth element lists [index, address, length] per lent part, in increasing index
//        order, each naming an empty part with a non-zero length; anything else is a
//        malformed header. Hello carries the lender's probe only with kHelloLend, HelloAck
//        the kAckPull flag only when set, so every frame of a link that lends nothing keeps
//        its earlier form.
//   WI-9 A lent part that lies in a shared block of the sender (channel CH-29) is listed as
//        [index, address, length, fd, inode, generation], fd at most INT32_MAX; any other
//        length of that list is a malformed header. A receiver that does not map the block
//        pulls the part from its address as any other.
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
  uint32_t flags = 0;  // kHelloReverse, kHelloLend
  // kHelloLend (WI-8): 8 bytes of the dialler's memory at `probe_addr` hold `probe_value`;
  // a receiver that reads them there with process_vm_readv may pull lent parts. Encoded
  // (as elements 6 and 7) only with kHelloLend.
  uint64_t probe_addr = 0;
  uint64_t probe_value = 0;
};
// Hello::flags: this connection is a client's duplex to its gateway (GW-1): the dialler
// becomes the receiver, the listener sends its Hello and Data back on it.
inline constexpr uint32_t kHelloReverse = 1;
// Hello::flags: the dialler can lend large parts (WI-8) and offers the probe above.
inline constexpr uint32_t kHelloLend = 2;

// Answer to Hello: the highest seq the receiver has delivered in this session (0: none).
// `flags` (encoded only when set) is kAckPull: the receiver read the Hello's probe and pulls
// lent parts (WI-8).
struct HelloAck {
  uint64_t delivered_seq = 0;
  uint32_t flags = 0;
};
inline constexpr uint32_t kAckPull = 1;

// WI-8: a part the sender lends instead of writing it to the socket: `len` bytes at `addr`
// in the sender's memory, for the receiver to pull; its table entry is 0 bytes.
// WI-9: `fd` >= 0 when the part lies at offset 0 of a shared block (channel CH-29) that the
// receiver may map instead of pulling: the sender's descriptor, the memfd's inode, and the
// generation of this copy.
struct LentPart {
  uint32_t index = 0;
  uint64_t addr = 0;
  uint64_t len = 0;
  int32_t fd = -1;
  uint64_t ino = 0;
  uint64_t gen = 0;
};

// One envelope; seqs increase within a session (gaps are allowed). `lent` (WI-8) lists the
// parts the receiver must pull before the envelope is complete: those parts are empty until
// then.
struct Data {
  uint64_t seq = 0;
  Envelope envelope;
  std::vector<LentPart> lent;
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
// WI-8: the same, lending every part of at least `lend_min` bytes (0: none): the header names
// its address and length, the table says 0 bytes, and the caller writes only the other parts.
void encode_data(uint64_t seq, const Envelope& env, std::vector<std::byte>& out,
                 size_t lend_min);
// The smallest part a link lends (a smaller threshold is raised to it): pulling costs a
// round trip through the kernel's page tables, worth it only for large parts.
inline constexpr size_t kMinLendBytes = 64 * 1024;
// Whether encode_data(..., lend_min) lends `part`.
inline bool lends(const Buffer& part, size_t lend_min) {
  return lend_min > 0 && part.size() >= lend_min;
}

// An upper bound on the bytes of `env`'s Data frame, to refuse it before queueing; with
// `header_bound`, also one on its msgpack header alone (WI-5).
size_t data_frame_bound(const Envelope& env, size_t* header_bound = nullptr);

// Decodes a frame's header (and moves its parts into a Data envelope).
[[nodiscard]] Result<Message> decode(RawFrame&& frame);

}  // namespace podium::wire
