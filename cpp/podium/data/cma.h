// podium::data::cma — the engine's same-host copies with process_vm_readv/writev (DA-10) and
// the priority of the threads that run them (DA-11); internal to the data plane (engine.cc).
// Threads: any; no state.
#pragma once

#include <cstddef>
#include <cstdint>

#include "podium/data/engine.h"

namespace podium::data::cma {

// Copies [offset, offset + len) of `o` between this process and o.peer_pid: 0, or an errno
// (ESRCH: the peer ended; EPERM: the kernel refuses CMA). The part inside o.window is copied
// with memcpy (DA-30); its bytes are added to `*through_window`.
// With `sum`, also sets `*sum` to the word sum (DA-40) of the local bytes [offset, offset +
// len) as that part of the operation's local region (word_sum_at), taken as they are copied
// where the part inside o.window is read (cached_copy_sum), else after the copy.
int copy(const Op& o, size_t offset, size_t len, uint64_t* through_window = nullptr,
         uint64_t* sum = nullptr);

// Invariants:
//   DA-36 The part of an operation of at least kStreamMinBytes that lies in the owner's shared
//         pages is copied with stream_copy (non-temporal stores, fenced before the copy
//         counts as done): its destination is not read for ownership first, and the copy
//         does not flush the last-level cache that the control path runs from. Smaller ones,
//         whose destination a reader uses next from the cache, are copied with memcpy.
inline constexpr size_t kStreamMinBytes = size_t{16} << 20;
// Copies `n` bytes from `src` to `dst` (no overlap) with non-temporal stores where the CPU
// has them (x86-64: SSE2), then fences them; a plain memcpy elsewhere.
void stream_copy(void* dst, const void* src, size_t n);
// Copies `n` bytes from `src` to `dst` (no overlap) through the cache, as memcpy; where the
// two are not aligned alike within a cache line and the copy is long (x86-64), with
// unaligned loads and aligned stores: glibc's memcpy lost 6% there on the 2-core VM (a 1 MiB
// copy from a buffer at its owner's offset, 22.4 µs against 21.1; docs/data_figures.md).
void cached_copy(void* dst, const void* src, size_t n);
// cached_copy, returning word_sum_at(dst, n, at) (DA-40) of the bytes copied. Where the
// region's words fall on 8-byte boundaries (dst - at a multiple of 8) and the copy is long
// (x86-64), the words are summed as they are loaded for the copy: no second pass. Else the
// sum is taken after the copy, while the bytes are in the cache.
uint64_t cached_copy_sum(void* dst, const void* src, size_t n, size_t at);
// stream_copy, returning word_sum_at(dst, n, at) of the bytes copied, summed as loaded
// (wherever the region's words are 8-aligned: the streamed stores leave nothing in the cache
// to sum from after).
uint64_t stream_copy_sum(void* dst, const void* src, size_t n, size_t at);

// DA-33: whether process `pid` is ending: gone, or its exit decided (kill() with SIGKILL and
// a fatal signal decide it at once, before its memory goes away). One process_mrelease(2) on
// a pidfd kept open per pid: for a process that is not ending the kernel does nothing; for one
// that is, it frees the process's private memory (its OOM reaper's work, which only hastens an
// end already certain). Where that call is missing or refused, one pread of its
// /proc/<pid>/stat, kept open per pid (a zombie, its main thread exiting, or SIGKILL pending).
bool ending(int pid);

namespace detail {
// ending()'s two forms. mrelease_probe: 1 (ending), 0 (not), -1 (the call is missing or
// refused in this process, which then always answers -1).
int mrelease_probe(int pid);
bool stat_says_ending(int pid);
}  // namespace detail

// DA-11: the calling thread runs `nice` steps below its current priority (at most 19), so a
// proc's loop and actor threads, which carry control, win the CPU from a bulk copy.
void lower_priority(int nice);

}  // namespace podium::data::cma
