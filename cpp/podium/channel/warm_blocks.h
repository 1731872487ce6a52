// Internal to podium_channel: warm blocks for pulled parts (CH-27).
//
// A part pulled from a sender (CH-25) lands in memory allocated for it. Fresh memory costs the
// kernel a fault and a clearing of every page before the copy can fill it: for a 256 MiB
// tensor that was about a third of the pull here. A program that receives tensors of one
// shape step after step frees one such block and allocates the same size again, so a block
// freed here is kept, its pages mapped, for the next pull of exactly its size.
//
// Threads: every function is thread-safe. Locks: the cache's mutex is a leaf.
// Invariants:
//   CH-27 Blocks of at least kWarmMinBytes are kept when freed, at most warm_limit() bytes in
//         all (PODIUM_WARM_RECV_BYTES; default the smaller of 1 GiB and an eighth of the
//         machine's memory; 0: none kept), and each at most kWarmIdle: a take or a give
//         releases the blocks older than that, and so does sweep_warm(), which the puller
//         threads call when they have had nothing to do for a second. A block is handed out
//         again only for a part of its exact size, which the pull then overwrites whole.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace podium::channel::internal {

inline constexpr size_t kWarmMinBytes = size_t{4} << 20;
inline constexpr std::chrono::seconds kWarmIdle{2};

// A block of `len` bytes aligned to `align`: a warm one when one of that size is kept, else a
// new one (nullptr when there is no memory); `*warm`, when given, says which. Free it with
// give_warm(p, len).
void* take_warm(size_t len, size_t align, bool* warm = nullptr);
// Keeps `p` (from take_warm, `len` bytes) for a later take, or frees it (CH-27).
void give_warm(void* p, size_t len);
// Frees the kept blocks older than kWarmIdle.
void sweep_warm();
size_t warm_limit();

struct WarmCounts {
  uint64_t reused = 0;  // takes served by a kept block
  uint64_t kept = 0;    // blocks kept now
  uint64_t bytes = 0;   // their bytes
};
WarmCounts warm_counts();

}  // namespace podium::channel::internal
