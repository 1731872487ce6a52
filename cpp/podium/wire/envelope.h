// podium::wire::Envelope — one actor-level message as it crosses a channel.
//
// The channel layer moves Envelopes between procs reliably and in order; it does not interpret
// `dest`, `sender`, `kind` or the ordering fields, which belong to the actor layer. `parts` are
// the payload: each part is written to the socket as its own iovec (never copied into one
// buffer on the send side).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "podium/base/buffer.h"

namespace podium::wire {

struct Envelope {
  uint8_t kind = 0;           // actor-layer message kind; opaque to wire and channel
  std::string dest;           // destination PortId in the actor layer's text form
  std::string sender;         // sending ActorId in the actor layer's text form
  uint64_t order_stream = 0;  // end-to-end ordering stream chosen by the sender (0 = none)
  uint64_t order_seq = 0;     // position of this message in that stream
  std::vector<std::pair<std::string, std::string>> headers;
  std::vector<Buffer> parts;
};

}  // namespace podium::wire
