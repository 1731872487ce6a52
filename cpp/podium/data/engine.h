// podium::data::Engine — the data plane of one process: one UCX context and one UCX worker,
// memory registration with a cache, and one-sided get and put to other processes' registered
// memory (docs/data.md).
//
// The engine never creates a UCX listener: it reaches a peer only through an endpoint made
// from that peer's worker address (Op::peer), and podium hands it only addresses that came
// over the authenticated control plane (a buffer reference pickled through an endpoint call).
// What UCX's transports themselves open is in docs/data.md, "What UCX exposes".
//
// Threads: every public member is thread-safe. Every UCX call is made under the engine's
// one mutex (the worker is UCS_THREAD_MODE_SERIALIZED). One progress thread of the engine
// drives the worker: it waits on the worker's event fd (and a wake-up eventfd) and runs
// ucp_worker_progress, so a peer's software-emulated RMA is served and completions are
// delivered without the caller polling. copiers - 1 copy threads (podium-data-cp) copy CMA
// chunks beside it (DA-11), with no lock held while they copy. Completions set the
// transfer's Future after the mutex is released, on the progress thread or a copy thread (or
// on the submitting thread when UCX completed the transfer at once): on_ready callbacks must
// not block, and may submit again.
// Locks: Engine::Impl::mu (every UCX call, the endpoint, transfer and registration tables) is
// a leaf: nothing else is taken under it and no callback runs under it.
// Invariants:
//   DA-1 One engine per process (instance()), started on first use: nothing of UCX is
//        touched before the first RDMA buffer or transfer.
//   DA-2 Registering a region that is registered already (same address and size) returns the
//        same Registration; the region is unmapped (ucp_mem_unmap) when its last holder drops
//        it, so registration_count() counts live regions only.
//   DA-3 A transfer larger than the chunk size runs as chunks of at most chunk_bytes, at most
//        `window` of them in flight per operation, the next posted as one completes.
//   DA-4 A put completes only once the remote side holds the bytes (the endpoint is flushed
//        after the last chunk), not when the local buffer may be reused.
//   DA-5 A transfer that does not finish within its timeout fails with kTimeout; no chunk is
//        posted after that, and the local memory stays pinned (Op::keep) until UCX has
//        finished or cancelled every chunk already in flight.
//   DA-6 A transfer to a peer whose endpoint failed (the process died, the connection broke)
//        fails with kTransferFailed naming UCX's status; the endpoint is closed and the next
//        transfer to that address makes a new one. This holds for endpoints in UCX's PEER
//        error mode: every peer on another host, and every peer when UCX_TLS allows TCP only.
//   DA-9 An endpoint to a peer on this host (Op::same_host) is made in UCX's NONE error mode,
//        since UCX 1.13 offers its shared-memory and CMA transports only in that mode; its
//        peer's death is not reported by UCX (podium's control plane reports it, and a
//        transfer in flight ends by UCX's error or its timeout), and its timeouts cannot
//        cancel what is in flight (UCX can force-close only PEER endpoints).
//   DA-10 An operation on a peer of this host whose pid is known (Op::peer_pid) is copied with
//        process_vm_readv / process_vm_writev (CMA) by the progress thread, a chunk at a
//        time (DA-3), outside the engine's lock, when the kernel allows it (cma_allowed()):
//        UCX 1.13 offers no zero-copy RMA on user memory within a host (its CMA transport is
//        not used for RMA, and its shared-memory transports map only memory UCX allocated),
//        so its RMA there is emulated with messages. PODIUM_RDMA_CMA=0 turns this off; a
//        copy the kernel refuses (EPERM) fails its transfer and turns it off for the rest
//        of the process. A dead peer fails the copy at once (ESRCH). The part of such an
//        operation that lies in the owner's shared pages (Op::window, DA-29, DA-30) is copied
//        with memcpy through the reader's mapping of them instead, the rest with CMA.
//   DA-11 CMA chunks are copied by `copiers` threads at once: the progress thread and
//        copiers - 1 copy threads; by default 2 where the process may run on 4 CPUs or more,
//        else 1, so bulk takes at most half of its cores (PODIUM_RDMA_CMA_THREADS). Chunks
//        are taken round robin over every operation that has some left, so a small transfer
//        waits behind at most one chunk per copier of a large one; an operation of at least
//        2 * kMinCmaChunk bytes is cut into at least `copiers` chunks so that one transfer
//        uses every copier. No lock is held while a chunk is copied, no copy runs on a proc's
//        loop thread, none on an actor's but DA-31's small ones, and the data threads run `nice` steps below the process
//        (PODIUM_RDMA_NICE): bulk never holds up the control plane (docs/data.md, "Control
//        never waits behind bulk").
//   DA-31 A transfer submitted with caller_copies (podium.rdma's leased transfers, on the
//        caller's thread) whose operations are all same-host CMA operations (DA-10) and whose
//        cost is small (bytes through shared pages plus 4 times the bytes through CMA, the
//        partial pages at a window's two ends, one system call, not counted; at most
//        kCallerCopyBytes) is copied by the calling thread inside submit(): no thread hop, and
//        the future is ready when submit() returns. This is the one copy made outside the data
//        threads (DA-11); it lasts at most about as long as a memcpy of kCallerCopyBytes.
//   DA-37 Where the engine has more than one copier (DA-11), a DA-31 operation of at least
//        2 * kMinCmaChunk bytes is not copied whole by its caller: it is cut into chunks as
//        the copiers' are, offered to them, and the caller takes chunks of it too until none
//        is left, so one small transfer runs on the caller and the copiers at once; its future
//        is ready when the last chunk, the caller's or a copier's, is done.
//   DA-43 copy_now() copies one operation that DA-31 would give its caller whole (not one
//        DA-37 shares with the copiers) on the calling thread at once, without a transfer's
//        bookkeeping (no future, no timer, no entry among the active transfers): the leased
//        single-operation read or write of podium.rdma, whose fixed cost is most of a 1 MiB
//        copy's budget. It counts as a caller-copied transfer only when the copy succeeded;
//        a failed one counts nothing, and its caller submits the operation, whose failure
//        submit() then reports as it would have (a copy is idempotent: the same bytes again).
//        Asked for a sum, it gives the word sum (DA-40) of what a get read, summed as copied.
//   DA-44 A get that carries a CopySum (Op::sum) and that the engine copies itself (DA-10:
//        CMA, and shared pages, DA-30) is summed by each of its chunks as it is copied (the
//        words added as they are loaded where the destination's words are 8-aligned, DA-43's
//        cma::copy with a sum), each chunk's share weighted by its place in the operation
//        (word_sum_at) and added to `value`; `taken` is set when the operation is given to
//        those copies. So a large summed read makes no second pass over bytes that have left
//        the cache by its end.
//   DA-38 register_memory(..., share = false) leaves the region's pages where they are: no
//        move into shared pages (DA-29), so the region's same-host readers copy it with CMA.
//        For a buffer made to be read once (the tensor engine's to_mesh), whose move (a copy
//        into fresh memfd pages) would cost more than the one read gains.
//   DA-33 The first chunk of every same-host copy (DA-10) asks the kernel whether the
//        peer is ending (cma::ending: gone, or its exit decided, which kill() with SIGKILL
//        and a fatal signal decide inside the call) and fails as a copy from a dead peer
//        (ESRCH) when it is: a process that kill() or a fatal signal hit keeps its memory for
//        tens of µs to ms (until its main thread runs its exit), and a transfer that starts
//        after the kill must not succeed in that window. A CMA chunk asks before it copies; a
//        chunk through the owner's shared pages (DA-30) asks after, in place of DA-30's own
//        question (the same answer, and one system call for both).
//   DA-34 The progress thread polls the worker without sleeping for `spin` after its last
//        activity (a progress that did something, a transfer in flight or just submitted):
//        a peer's request or reply is then handled as it arrives, not after the thread's
//        wake-up (on loopback TCP a 4 KiB get took 105 µs with wake-ups on both sides and 17
//        µs with both spinning). Default 200 µs from 4 CPUs up, none below
//        (PODIUM_RDMA_SPIN_US); idle, the thread sleeps as before.
//   DA-23 A region of CUDA memory (Memory::kCuda) is registered with UCX as CUDA memory, and
//        an operation whose local or remote region is CUDA memory goes through UCX (its
//        cuda_copy and cuda_ipc transports: GPU to GPU, GPU to host), never through CMA; the
//        local region's memory type is given to UCX with each chunk. Where this process's UCX
//        has no CUDA support (supports(kCuda) is false), registering CUDA memory fails with
//        kUnavailable naming it, before anything is mapped.
//   DA-24 UCX's pipelined RMA protocols are on (RMA_PPLN_ENABLE, UCX 1.22 and later) unless
//        UCX_RMA_PPLN_ENABLE is set: without them UCX 1.22 moves a get of CUDA memory, and
//        every transfer between GPU and host memory, by software emulation over shared-memory
//        segments (under 1 GB/s on an H200); with them a get of CUDA memory on one host is a
//        zero-copy write by the owner's side over cuda_ipc, and GPU-host transfers run as
//        pipelined copies (docs/data.md, "GPU memory", has the figures).
//   DA-21 UCX_NET_DEVICES in the environment wins; else EngineConfig::net_devices, when set,
//        restricts UCX's network transports (and so the TCP listener UCX's tcp transport
//        opens on every device it uses) to those devices (ucp_config_modify before ucp_init).
//   DA-22 UCX's TCP segments are 1 MiB (UCX_TCP_TX_SEG_SIZE, UCX_TCP_RX_SEG_SIZE) unless the
//        environment sets them: UCX emulates RMA over TCP with one message per segment.
//   DA-51 With EngineConfig::without_tcp (podium's own TCP path carries host memory between
//        hosts, DA-49) and UCX_TLS not in the environment, UCX runs without its tcp transport
//        ("^tcp"), so it opens no TCP listener, which would authenticate nothing; a UCX with
//        CUDA support keeps it (GPU memory between hosts without RDMA hardware goes through
//        UCX's tcp transport): the context is made again without the exclusion.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "podium/actor/future.h"
#include "podium/base/error.h"
#include "podium/data/errc.h"
#include "podium/data/shm.h"

namespace podium::data {

inline constexpr size_t kDefaultChunkBytes = size_t{4} << 20;
inline constexpr size_t kDefaultWindow = 4;
inline constexpr size_t kMaxDefaultCopiers = 2;
inline constexpr int kDefaultNice = 5;
inline constexpr size_t kMinCmaChunk = size_t{256} << 10;
inline constexpr size_t kCallerCopyBytes = size_t{4} << 20;  // DA-31
inline constexpr std::chrono::microseconds kDefaultSpin{200};  // DA-34

// Where a region's bytes live (DA-23).
enum class Memory : uint8_t { kHost, kCuda };

struct EngineConfig {
  size_t chunk_bytes = kDefaultChunkBytes;  // DA-3
  size_t window = kDefaultWindow;           // DA-3
  size_t copiers = 0;                       // DA-11: CMA copy threads; 0: default_copiers()
  int nice = kDefaultNice;                  // DA-11: data threads' nice, above the process's
  // DA-34: how long the progress thread keeps polling after its last activity; negative:
  // default_spin().
  std::chrono::microseconds spin{-1};
  // DA-21: the network devices UCX may use (UCX_NET_DEVICES' syntax: "eth0", "eth0,ib0"),
  // when the environment does not set UCX_NET_DEVICES itself. Empty: UCX's default (all).
  std::string net_devices;
  // DA-51: leave out UCX's tcp transport (and so its unauthenticated listener), unless
  // UCX_TLS is set or this UCX has CUDA support.
  bool without_tcp = false;
};

// One registered (ucp_mem_map'd) region. Unmapped when the last shared_ptr to it drops (DA-2).
class Registration {
 public:
  ~Registration();
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

  uint64_t addr() const { return addr_; }
  size_t size() const { return size_; }
  // The packed remote key: what a peer needs, with addr(), to reach this region.
  const std::string& rkey() const { return rkey_; }
  // DA-29: the region's whole pages as shared pages, when they were moved (else !valid()).
  shm::WindowRef window() const { return pages_ ? pages_->ref() : shm::WindowRef{}; }

  struct Impl;

 private:
  friend class Engine;
  Registration() = default;
  std::shared_ptr<void> engine_;  // Engine::Impl, kept alive while the region is mapped
  void* memh_ = nullptr;          // ucp_mem_h
  uint64_t addr_ = 0;
  size_t size_ = 0;
  std::string rkey_;
  std::shared_ptr<const void> keep_;  // keeps the memory itself alive while registered
  std::shared_ptr<shm::SharedPages> pages_;  // DA-29
};

// One one-sided operation of a transfer.
// DA-44: the word sum (DA-40) of what a get read, for a reader that asked for it, added up
// by the engine's own copies (CMA and shared pages) chunk by chunk as they copy. `taken`: the
// operation is copied that way, so `value` is its whole sum once the transfer succeeded; an
// operation that goes through UCX leaves it false, for its caller to sum after.
struct CopySum {
  std::atomic<uint64_t> value{0};
  std::atomic<bool> taken{false};
};

struct Op {
  enum class Kind { kGet, kPut };
  Kind kind = Kind::kGet;
  std::string peer;          // the remote worker's address, as its address() returned it
  uint64_t remote_addr = 0;  // in the remote process, inside a Registration of that process
  std::string rkey;          // that Registration's rkey()
  std::byte* local = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> keep;  // keeps `local` alive until UCX is done with it (DA-5)
  bool same_host = false;            // the peer runs on this host (DA-9)
  int peer_pid = 0;                  // its process id, when same_host (DA-10)
  Memory local_memory = Memory::kHost;   // where `local` lives (DA-23)
  Memory remote_memory = Memory::kHost;  // where the remote region lives (DA-23)
  // DA-30: the owner's shared pages mapped in this process (a same-host CMA operation only):
  // the part of the remote range inside it is copied with memcpy.
  std::shared_ptr<const shm::Window> window;
  // DA-44: a get whose reader wants its sum (one per attempt: a late chunk of an attempt that
  // timed out must not add to the next one's).
  std::shared_ptr<CopySum> sum;
};

class Engine {
 public:
  // DA-1: this process's engine, made on the first call (chunk size, copiers and nice from
  // PODIUM_RDMA_CHUNK_BYTES, PODIUM_RDMA_CMA_THREADS and PODIUM_RDMA_NICE, when set;
  // `net_devices` as EngineConfig's, DA-21). Later calls return the same engine, or the same
  // error, whatever they pass.
  // `without_tcp` as EngineConfig's (DA-51).
  [[nodiscard]] static Result<Engine*> instance(std::string_view net_devices = {},
                                                bool without_tcp = false);
  // A separate engine (tests, benchmarks).
  [[nodiscard]] static Result<std::unique_ptr<Engine>> make(EngineConfig config = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // This worker's address (opaque bytes), for peers that will reach this process.
  const std::string& address() const;
  // The network devices UCX was restricted to (DA-21): EngineConfig::net_devices, or
  // UCX_NET_DEVICES from the environment; empty: UCX's default (every device).
  const std::string& net_devices() const;
  // DA-51: whether UCX's tcp transport may run in this engine (false: left out).
  bool ucx_tcp() const;
  // The UCX version this engine runs on ("1.13.1").
  static std::string ucx_version();
  // DA-10: whether same-host operations are copied with CMA (PODIUM_RDMA_CMA is not 0, and
  // the kernel lets this process use process_vm_readv).
  static bool cma_allowed();
  // DA-11: kMaxDefaultCopiers where this process may run on 2 * kMaxDefaultCopiers CPUs or
  // more (its affinity mask), else 1: bulk copies take at most half of its cores.
  static size_t default_copiers();
  // DA-34: PODIUM_RDMA_SPIN_US when set; else kDefaultSpin where this process may run on
  // 2 * kMaxDefaultCopiers CPUs or more, else 0 (on fewer cores a spinning thread takes the
  // core its peer needs).
  static std::chrono::microseconds default_spin();

  // DA-2. `keep` holds the memory alive while it is registered. DA-23: `memory` says where
  // the region lives; CUDA memory needs supports(Memory::kCuda). DA-38: `share` false keeps
  // the region's pages where they are (no move into shared pages, DA-29), for a buffer that
  // will be read once: the move would cost more than it saves.
  [[nodiscard]] Result<std::shared_ptr<Registration>> register_memory(
      const void* addr, size_t size, std::shared_ptr<const void> keep,
      Memory memory = Memory::kHost, bool share = true);
  // DA-23: whether this process's UCX can reach `memory` (host memory: always; CUDA: a UCX
  // built with CUDA support, with its CUDA modules loaded).
  bool supports(Memory memory) const;
  size_t registration_count() const;

  // Runs `ops` in parallel; the future resolves once all are done, or with the first error.
  // DA-31: with `caller_copies`, a small same-host transfer is copied by the calling thread
  // before submit() returns.
  actor::Future<void> submit(std::vector<Op> ops, std::chrono::nanoseconds timeout,
                             bool caller_copies = false);
  // DA-43: copies `op` here and now when submit() with caller_copies would have let this
  // thread copy it whole; nothing when it would not (submit it instead); else 0 (done) or the
  // copy's errno (not counted: submit it, and that reports the failure).
  // With `sum`, a get's word sum (DA-40) of the bytes it read is set there (cma::copy's).
  [[nodiscard]] std::optional<int> copy_now(const Op& op, uint64_t* sum = nullptr);

  struct Stats {
    uint64_t transfers = 0;    // submitted
    uint64_t chunks = 0;       // chunk requests posted (DA-3)
    uint64_t bytes = 0;        // bytes of completed operations
    uint64_t timeouts = 0;     // transfers failed by their timeout (DA-5)
    uint64_t endpoints = 0;    // endpoints open now
    uint64_t active = 0;       // transfers (or their chunks) still in UCX's hands
    uint64_t copiers = 0;      // threads that copy CMA chunks (DA-11)
    uint64_t window_bytes = 0;    // bytes copied through shared pages (DA-30)
    uint64_t caller_copied = 0;   // transfers copied by their caller (DA-31)
  };
  Stats stats() const;

  // Stops the progress thread and closes every endpoint; transfers still running fail with
  // kStopped. Idempotent. Registrations stay valid until dropped.
  void stop();

  struct Impl;

 private:
  explicit Engine(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace podium::data
