// Internal to podium_channel: large parts copied into shared blocks (CH-29).
//
// A lent part (CH-25) is pulled by the receiver with process_vm_readv, which copies through
// the kernel's page tables at about half of memcpy's speed. A part sent to one receiver is
// instead copied by the sender into a block of shared memory (a memfd of its own, kept for the
// next part of the same size), and the receiver maps that block: one memcpy in all, and the
// receiver's part is the block itself.
//
// A block is [header page][data]. The header holds a magic number and one word,
// generation << 2 | state: 0 free, 1 lent (copied, sent, not claimed), 2 held by a receiver.
//
// Threads: every function is thread-safe. Locks: each side's mutex is a leaf.
// Invariants:
//   CH-29 The sender writes a block only while it is free (state 0) and no Buffer of its own
//         refers to it. A receiver uses a block only after changing its word from the
//         generation its frame names, lent, to held (a compare-and-swap): it then has the
//         block alone until its Buffer is released, which sets the word free. The sender's
//         Buffer, released (the receiver acked, or the envelope was handed back), sets
//         lent to free: a receiver that never claimed the block (it pulled the part, or the
//         frame was a duplicate) cannot leave it lent. A block no side uses for kSharedIdle
//         is unmapped and closed; one a receiver holds stays mapped there until it releases
//         it. The sender keeps at most shared_limit() bytes of blocks (PODIUM_SHARED_SEND_BYTES;
//         default as CH-27's warm blocks) and 64 blocks; past that, parts are lent as before.
//         A block is sealed at its size, so that a receiver's mapping cannot lose its pages.
//         Forks: a release in another process than the copy or the claim does nothing; a
//         receiver that forked after it claimed a block leaves it held when it releases it
//         (the child may still read it); a child starts with no blocks or mappings.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "podium/base/buffer.h"
#include "podium/wire/envelope.h"
#include "podium/wire/message.h"

namespace podium::channel::internal {

inline constexpr std::chrono::seconds kSharedIdle{2};

// The sender's side: copies every part of `env` of at least `min_bytes` into a shared block
// and records it in env.shared; a part that gets no block (over the limit, no memory) stays
// as it is. Runs on the sending thread (the copy is the caller's, as a write would be).
void share_parts(wire::Envelope& env, size_t min_bytes);

// The receiver's side: the lent part `l` of process `pid` as the block it lies in, mapped and
// claimed; nullopt when it names no block or the block cannot be mapped or claimed (the
// caller pulls the part from l.addr instead). `mapped_only`: only a block mapped here
// already, with no system call (nullopt otherwise, and not counted as a failure).
std::optional<Buffer> map_shared(pid_t pid, const wire::LentPart& l, bool mapped_only = false);

// Unmaps and closes what neither side used for kSharedIdle (both sides).
void sweep_shared();
size_t shared_limit();

struct SharedCounts {
  uint64_t copied = 0;        // parts copied into a block (sender)
  uint64_t blocks_made = 0;   // blocks created (sender); copied - blocks_made reused one
  uint64_t blocks = 0;        // blocks kept now (sender)
  uint64_t bytes = 0;         // their bytes
  uint64_t mapped = 0;        // parts taken as a mapped block (receiver)
  uint64_t map_failed = 0;    // parts naming a block that were pulled instead (receiver)
  uint64_t mappings = 0;      // blocks mapped now (receiver)
};
SharedCounts shared_counts();

}  // namespace podium::channel::internal
