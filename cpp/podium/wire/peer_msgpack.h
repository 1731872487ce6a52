// podium::wire limits for msgpack-cxx decoding of bytes a peer sent (docs/wire.md, WI-7).
//
// msgpack::unpack believes the counts it reads: a 5-byte array header announcing 2^32
// elements makes it ask for 128 GiB for its zone before it finds the bytes missing.
// Every msgpack::unpack of peer bytes (actor call, reply and system headers, failure reports,
// cast plans and run tables) passes peer_unpack_limit(size) instead of the default limits.
//
// Invariants (tests name them):
//   WI-7 A peer's msgpack value of N bytes makes msgpack-cxx allocate O(N): no array, map,
//        str, bin or ext may announce more elements or bytes than the input holds, and
//        nesting stops at kMaxPeerDepth; a violation is a decode error (a msgpack exception
//        the caller already turns into an Error), not an allocation.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <msgpack/unpack_decl.hpp>

namespace podium::wire {

inline constexpr size_t kMaxPeerDepth = 128;

inline msgpack::unpack_limit peer_unpack_limit(size_t bytes) {
  // Each element or pair takes at least one byte, each str/bin/ext byte is one byte.
  size_t n = std::min<size_t>(bytes, UINT32_MAX);
  return msgpack::unpack_limit(n, n, n, n, n, kMaxPeerDepth);
}

}  // namespace podium::wire
