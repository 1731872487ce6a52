// podium::data::shm — same-host buffers as shared pages, so that a reader on the owner's host
// copies them with memcpy instead of the kernel's per-page CMA copy (docs/data.md, "Shared
// pages"). Internal to the data plane (engine, podium._core.data).
//
// The owner's side: share_pages() moves the whole pages inside a region of private anonymous
// memory (malloc'd arrays, tensors, bytearrays) into a memfd, in place: the pages' bytes are
// copied into the memfd, which is then mapped over the same addresses (MAP_FIXED). The
// process's pointers stay valid and its code sees no difference. A reader on the same host
// takes the memfd from the owner (pidfd_getfd, which asks the same permission as CMA) and maps
// it: a Window.
//
// Threads: share_pages() and open_window() any thread; a Window is immutable after it is made.
// Invariants:
//   DA-29 Only whole pages of private anonymous, writable memory ("rw-p", no file: the heap or
//         anonymous mappings) or of a podium memfd that no live SharedPages holds (pages given
//         back, DA-32, that the allocator handed out again) are moved, and
//         only when at least `min_bytes` of them lie inside the region: file mappings (np.memmap),
//         read-only and already shared memory keep their backing, and the partial pages at the
//         region's two ends (which may hold other objects) are never moved. The move preserves
//         every byte; a write by another thread to those pages while share_pages() runs may be
//         lost, so a buffer is shared while its memory is not being written (RDMABuffer() runs
//         in the owner's own thread). After the move, the pages stay shared with the memfd for
//         the buffer's registration (a fork while it is registered shares them instead of
//         copying them). Unless PODIUM_RDMA_SHM=1, nothing is moved in a process that maps a
//         GPU or RDMA device (/dev/nvidia*, /dev/infiniband/*), whose drivers may pin user
//         pages (cudaHostRegister, an RDMA memory region) that a move would leave behind.
//   DA-32 When the last registration of shared pages ends, they are given back: on a thread of
//         their own (the "podium-shm" thread) with the memory kept alive until then when a
//         `keep` holds it, else at once, before the destructor returns (the caller may free the
//         memory right after; a give-back after that would map over freed memory). The range is
//         mapped again privately over the same memfd (MAP_FIXED: a write racing the swap lands
//         in the memfd, which the new mapping reads), every page is made private by an atomic
//         add of 0 to one of its words, and the memfd's pages are punched out. From then on the
//         range behaves as private anonymous memory again: a fork copies it, and an allocator
//         that drops its pages (MADV_DONTNEED) reads zeros back, as it may assume.
//   DA-30 A reader maps a window only after checking that the descriptor it took from the owner
//         is the memfd the buffer reference names (inode and device) and is large enough; a copy
//         through a window succeeds only when the owner is still running after it (its pidfd is
//         not readable), so a transfer from a dead owner fails as a CMA copy would (ESRCH).
//         The partial pages at the window's two ends go through CMA in one system call.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "podium/base/error.h"

namespace podium::data::shm {

// The smallest run of whole pages worth moving into shared pages (PODIUM_RDMA_SHM_MIN_BYTES;
// PODIUM_RDMA_SHM=0 turns sharing off).
inline constexpr size_t kDefaultMinBytes = size_t{256} << 10;

// What a reader needs to map an owner's shared pages: the owner's descriptor number, the
// memfd's identity, and the owner's addresses [begin, end) that the memfd's offset 0 maps.
struct WindowRef {
  int fd = -1;
  uint64_t ino = 0;
  uint64_t dev = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
  bool valid() const { return fd >= 0 && end > begin; }
};

// The owner's side (DA-29): a memfd mapped over [begin, end) of this process. The destructor
// gives the pages back (DA-32).
class SharedPages {
 public:
  ~SharedPages();
  SharedPages(const SharedPages&) = delete;
  SharedPages& operator=(const SharedPages&) = delete;
  const WindowRef& ref() const { return ref_; }

 private:
  friend Result<std::shared_ptr<SharedPages>> share_pages(const void*, size_t, size_t,
                                                          std::shared_ptr<const void>);
  SharedPages() = default;
  WindowRef ref_;
  std::shared_ptr<const void> keep_;  // the memory, alive until the pages are given back
};

// PODIUM_RDMA_SHM: unset (or "auto"): on, except in a process that maps a GPU or RDMA device
// (DA-29); "1": on even there (for a process whose buffers no driver pins); "0": off.
enum class Mode { kAuto, kOn, kOff };
// The kernel's page size: what sharing moves, and the most a window's partial end page holds.
size_t page_size();
Mode mode();
// Whether sharing is on (mode() is not kOff) and the smallest run it moves.
bool enabled();
size_t min_bytes();

// DA-29: moves the whole pages inside [addr, addr + size) into a memfd. Null (not an error)
// when they are fewer than `min_bytes` or any of them is not private anonymous writable memory
// (or an unheld podium memfd); an error when a system call fails.
// `keep` holds the memory alive until the pages are given back (DA-32).
[[nodiscard]] Result<std::shared_ptr<SharedPages>> share_pages(const void* addr, size_t size,
                                                                size_t min_bytes,
                                                                std::shared_ptr<const void> keep);
// DA-32: gives back the pages of every SharedPages that ended and waits until done (tests).
void wait_given_back();
// How many SharedPages of this process are live, and how many were given back so far.
size_t live_count();
uint64_t given_back_count();

// The reader's side (DA-30): the owner's pages, mapped here.
class Window {
 public:
  ~Window();
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;
  const WindowRef& ref() const { return ref_; }
  pid_t pid() const { return pid_; }
  // The bytes of owner address `addr` (inside [begin, end)).
  std::byte* at(uint64_t addr) const { return base_ + (addr - ref_.begin); }
  // Whether the owner is still running (its pidfd not readable).
  bool owner_alive() const;

 private:
  friend Result<std::shared_ptr<Window>> open_window(pid_t, const WindowRef&);
  Window() = default;
  WindowRef ref_;
  pid_t pid_ = 0;
  int pidfd_ = -1;
  std::byte* base_ = nullptr;
};

// DA-30: maps the owner `pid`'s window `ref`. Errors: the kernel refuses (EPERM, ENOSYS: the
// caller copies with CMA instead), the owner ended, or the descriptor is not the one named.
[[nodiscard]] Result<std::shared_ptr<Window>> open_window(pid_t pid, const WindowRef& ref);

// The reader's windows, made on first use and kept for the transfers that follow (DA-30). A
// window no operation holds is unmapped once it went unused for `idle` (sweep()), or at once
// when its owner ended: a mapping keeps the owner's pages alive, also after the owner freed them.
// Threads: every member is thread-safe; `mu_` is a leaf.
class WindowCache {
 public:
  using Clock = std::chrono::steady_clock;
  // The window of `pid`'s pages `ref`: null when it cannot be mapped (the kernel refuses, the
  // owner ended or closed them), which is remembered until swept, so the caller's CMA copies
  // do not retry the system calls each time.
  std::shared_ptr<const Window> get(pid_t pid, const WindowRef& ref, Clock::time_point now);
  // Forgets what went unused since `now - idle`, and the windows of owners that ended. Returns
  // how many entries are left.
  size_t sweep(Clock::time_point now, Clock::duration idle);
  size_t size() const;

 private:
  struct Entry {
    std::shared_ptr<const Window> window;  // null: could not be mapped
    Clock::time_point used;
  };
  using Key = std::tuple<pid_t, int, uint64_t, uint64_t, uint64_t, uint64_t>;
  mutable std::mutex mu_;
  std::map<Key, Entry> entries_;  // guarded by mu_
};

}  // namespace podium::data::shm
