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

// WI-9: a part the sender copied into a shared block of its own (channel CH-29): the memfd's
// descriptor number in the sender, its inode, and the generation the block's header holds for
// this copy. Sent only with the part's lent descriptor (WI-8).
struct SharedRef {
  uint32_t index = 0;  // the part's index in `parts`
  int32_t fd = -1;
  uint64_t ino = 0;
  uint64_t gen = 0;
};

struct Envelope {
  uint8_t kind = 0;           // actor-layer message kind; opaque to wire and channel
  std::string dest;           // destination PortId in the actor layer's text form
  std::string sender;         // sending ActorId in the actor layer's text form
  uint64_t order_stream = 0;  // end-to-end ordering stream chosen by the sender (0 = none)
  uint64_t order_seq = 0;     // position of this message in that stream
  std::vector<std::pair<std::string, std::string>> headers;
  std::vector<Buffer> parts;
  // Known to the sender only, never encoded as such:
  // - fan_out: the same parts go to other receivers too (a cast), so the channel lends them
  //   rather than copying them once per receiver (CH-29);
  // - shared: parts the channel copied into shared blocks (CH-29), which a lent descriptor
  //   names (WI-9).
  bool fan_out = false;
  std::vector<SharedRef> shared;
};

}  // namespace podium::wire
