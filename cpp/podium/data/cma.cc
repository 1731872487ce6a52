// podium's own same-host copies (DA-10) and the data threads' share of the CPU (DA-11): see
// cma.h and engine.h.
#include "podium/data/cma.h"
#include "podium/data/checksum.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace podium::data {
namespace cma {

namespace {

#ifdef SYS_process_mrelease
constexpr long kSysProcessMrelease = SYS_process_mrelease;
#else
constexpr long kSysProcessMrelease = 448;  // the same number on every architecture
#endif

// [offset, offset + len) of `o` with process_vm_readv / process_vm_writev.
int kernel_copy(const Op& o, size_t offset, size_t len) {
  size_t done = 0;
  while (done < len) {
    iovec local{o.local + offset + done, len - done};
    iovec remote{reinterpret_cast<void*>(o.remote_addr + offset + done), len - done};
    ssize_t n = o.kind == Op::Kind::kGet ? ::process_vm_readv(o.peer_pid, &local, 1, &remote, 1, 0)
                                         : ::process_vm_writev(o.peer_pid, &local, 1, &remote, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EFAULT;
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

// Copies [offset, offset + len) of `o` between this process and its peer: 0, or an errno.
// DA-10: what lies in the owner's shared pages with memcpy (DA-30), the rest with CMA.
int copy(const Op& o, size_t offset, size_t len, uint64_t* through_window, uint64_t* sum) {
  uint64_t lo = o.remote_addr + offset, hi = lo + len, b = 0, e = 0;
  if (o.window) {
    const auto& w = o.window->ref();
    b = std::max(lo, w.begin);
    e = std::min(hi, w.end);
  }
  // DA-33: a peer already told to die is not copied from or to, though its memory may remain.
  // Through a window the first chunk asks after its copy instead, one system call for both
  // questions (DA-30's below): a peer that is ending or gone then fails the copy as well.
  if (offset == 0 && b >= e && ending(o.peer_pid)) return ESRCH;
  if (o.window) {
    if (b < e) {
      // The partial pages at the ends (at most one each) in one system call (DA-30).
      iovec local[2], remote[2];
      int pieces = 0;
      size_t edges = 0;
      auto edge = [&](uint64_t from, uint64_t to) {
        if (from >= to) return;
        local[pieces] = {o.local + offset + (from - lo), to - from};
        remote[pieces] = {reinterpret_cast<void*>(from), to - from};
        edges += to - from;
        ++pieces;
      };
      edge(lo, b);
      edge(e, hi);
      if (pieces > 0) {
        ssize_t n = o.kind == Op::Kind::kGet
                        ? ::process_vm_readv(o.peer_pid, local, pieces, remote, pieces, 0)
                        : ::process_vm_writev(o.peer_pid, local, pieces, remote, pieces, 0);
        if (n < 0 && errno != EINTR) return errno;
        if (n != static_cast<ssize_t>(edges)) {  // partly done: each piece again, in full
          if (lo < b) {
            if (int err = kernel_copy(o, offset, b - lo)) return err;
          }
          if (e < hi) {
            if (int err = kernel_copy(o, offset + (e - lo), hi - e)) return err;
          }
        }
      }
      std::byte* local_at = o.local + offset + (b - lo);
      std::byte* remote_at = o.window->at(b);
      std::byte* to = o.kind == Op::Kind::kGet ? local_at : remote_at;
      const std::byte* from = o.kind == Op::Kind::kGet ? remote_at : local_at;
      uint64_t total = 0;
      if (sum) {  // the partial pages' part, copied above (DA-40: parts add up)
        total = word_sum_at(o.local + offset, b - lo, offset) +
                word_sum_at(o.local + offset + (e - lo), hi - e, offset + (e - lo));
      }
      size_t at = offset + (b - lo);  // where the window's part lies in the local region
      bool stream = o.size >= kStreamMinBytes;  // DA-36
      if (sum && o.kind == Op::Kind::kGet) {  // summed as copied (DA-43, DA-44)
        total += stream ? stream_copy_sum(to, from, e - b, at)
                        : cached_copy_sum(to, from, e - b, at);
      } else {
        stream ? stream_copy(to, from, e - b) : cached_copy(to, from, e - b);
        if (sum) total += word_sum_at(local_at, e - b, at);
      }
      if (sum) *sum = total;
      // DA-30: as CMA would have failed; DA-33 for the first chunk (ending: gone, or dying).
      if (offset == 0 ? ending(o.peer_pid) : !o.window->owner_alive()) return ESRCH;
      if (through_window) *through_window += e - b;
      return 0;
    }
  }
  int err = kernel_copy(o, offset, len);
  if (err == 0 && sum) *sum = word_sum_at(o.local + offset, len, offset);
  return err;
}

#if defined(__x86_64__) && defined(__SSE2__)
namespace {

// Copies `n` bytes in 64-byte lines stored to 64-byte-aligned destination addresses, the
// source loaded unaligned: with non-temporal stores (kStream, fenced after) or through the
// cache. What is before the first aligned line and after the last goes with memcpy. With
// kSum, also returns word_sum_at(d, n, at) (DA-40), the lines' words added as they are loaded:
// `d - at` must then be 8-aligned, so that the region's words fall on the lanes' (the caller
// checks). Without kSum, returns 0.
template <bool kStream, bool kSum>
uint64_t line_copy(char* d, const char* s, size_t n, size_t at = 0) {
  size_t head = std::min(n, (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63);
  std::memcpy(d, s, head);
  uint64_t sum = 0;
  if constexpr (kSum) sum = word_sum_at(d, head, at);
  d += head;
  s += head;
  n -= head;
  at += head;
  __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    auto* to = reinterpret_cast<__m128i*>(d + i);
    if constexpr (kStream) {
      _mm_stream_si128(to, a);
      _mm_stream_si128(to + 1, b);
      _mm_stream_si128(to + 2, c);
      _mm_stream_si128(to + 3, e);
    } else {
      _mm_store_si128(to, a);
      _mm_store_si128(to + 1, b);
      _mm_store_si128(to + 2, c);
      _mm_store_si128(to + 3, e);
    }
    if constexpr (kSum) {
      a0 = _mm_add_epi64(a0, a);
      a1 = _mm_add_epi64(a1, b);
      a2 = _mm_add_epi64(a2, c);
      a3 = _mm_add_epi64(a3, e);
    }
  }
  if constexpr (kStream) _mm_sfence();  // weakly ordered: visible before the copy is done
  std::memcpy(d + i, s + i, n - i);
  if constexpr (kSum) {
    sum += word_sum_at(d + i, n - i, at + i);
    __m128i t = _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3));
    uint64_t lanes[2];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(lanes), t);
    sum += lanes[0] + lanes[1];
  }
  return sum;
}

}  // namespace
#endif

uint64_t cached_copy_sum(void* dst, const void* src, size_t n, size_t at) {
#if defined(__x86_64__) && defined(__SSE2__)
  constexpr size_t kMinBytes = size_t{64} << 10;  // as cached_copy's
  if (n >= kMinBytes && (reinterpret_cast<uintptr_t>(dst) - at) % 8 == 0) {
    return line_copy<false, true>(static_cast<char*>(dst), static_cast<const char*>(src), n, at);
  }
#endif
  cached_copy(dst, src, n);
  return word_sum_at(dst, n, at);
}

uint64_t stream_copy_sum(void* dst, const void* src, size_t n, size_t at) {
#if defined(__x86_64__) && defined(__SSE2__)
  if ((reinterpret_cast<uintptr_t>(dst) - at) % 8 == 0) {
    return line_copy<true, true>(static_cast<char*>(dst), static_cast<const char*>(src), n, at);
  }
#endif
  stream_copy(dst, src, n);
  return word_sum_at(dst, n, at);
}

void cached_copy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__) && defined(__SSE2__)
  constexpr size_t kMinBytes = size_t{64} << 10;  // below it, memcpy's setup is what counts
  auto apart = (reinterpret_cast<uintptr_t>(dst) ^ reinterpret_cast<uintptr_t>(src)) & 63;
  if (n >= kMinBytes && apart != 0) {
    line_copy<false, false>(static_cast<char*>(dst), static_cast<const char*>(src), n);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

void stream_copy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__) && defined(__SSE2__)
  line_copy<true, false>(static_cast<char*>(dst), static_cast<const char*>(src), n);
#else
  std::memcpy(dst, src, n);
#endif
}

namespace {

// Descriptors kept open per pid, each naming that very process (a pidfd, an open
// /proc/<pid>/stat): a pid reused later is never taken for it. Shared: a descriptor that one
// thread is using stays open when another forgets it (the process ended) or the table is
// emptied (past 256 pids, each opened again on use).
class PidFds {
 public:
  struct Fd {
    explicit Fd(int fd) : fd(fd) {}
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    ~Fd() { ::close(fd); }
    const int fd;
  };
  using Ref = std::shared_ptr<const Fd>;

  // The descriptor kept for `pid`, or the one `open` gives (kept), or null when it fails.
  template <class Open>
  Ref get(int pid, Open open) {
    {
      std::lock_guard lock(mu_);
      auto it = fds_.find(pid);
      if (it != fds_.end()) return it->second;
    }
    int fd = open();
    if (fd < 0) return nullptr;
    auto ref = std::make_shared<const Fd>(fd);
    std::lock_guard lock(mu_);
    if (fds_.size() >= 256) fds_.clear();
    return fds_.try_emplace(pid, ref).first->second;
  }
  // The process of `ref` ended: its descriptor goes once its last user is done.
  void forget(int pid, const Ref& ref) {
    std::lock_guard lock(mu_);
    auto it = fds_.find(pid);
    if (it != fds_.end() && it->second == ref) fds_.erase(it);
  }

 private:
  std::mutex mu_;
  std::unordered_map<int, Ref> fds_;
};

}  // namespace

namespace detail {

// DA-33, first form: process_mrelease(2) on a pidfd of `pid`, kept open per pid. For a process
// that is not ending the kernel answers EINVAL and does nothing; for one that is (a group exit:
// what kill() with SIGKILL and every fatal signal set at once; or a lone thread exiting) it
// frees the process's private memory, as its OOM reaper would, and answers 0 or EAGAIN; for
// one that has let its memory go, or is gone, ESRCH. One system call of about 0.3 µs where the
// pread of /proc/<pid>/stat takes about 3 µs (the VM of docs/data_figures.md).
// Returns 1 (ending), 0 (not), or -1 (no answer: the call is missing or refused here).
int mrelease_probe(int pid) {
  static std::atomic<bool> refused{false};
  if (refused.load(std::memory_order_relaxed)) return -1;
  static auto* fds = new PidFds();  // lives with the process
  int open_err = 0;
  auto fd = fds->get(pid, [&] {
    int f = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    open_err = f < 0 ? errno : 0;
    return f;
  });
  if (!fd) {
    if (open_err == ESRCH) return 1;
    if (open_err == ENOSYS || open_err == EPERM) refused.store(true, std::memory_order_relaxed);
    return -1;
  }
  long r = ::syscall(kSysProcessMrelease, fd->fd, 0);
  int err = r == 0 ? 0 : errno;
  if (err == EINVAL) return 0;
  if (r == 0 || err == EAGAIN || err == ESRCH || err == EINTR) {
    fds->forget(pid, fd);
    return 1;
  }
  // ENOSYS (before Linux 5.15), EPERM (a seccomp profile): /proc/<pid>/stat from now on.
  if (err == ENOSYS || err == EPERM) refused.store(true, std::memory_order_relaxed);
  return -1;
}

// DA-33, second form: one pread of /proc/<pid>/stat, kept open per pid.
bool stat_says_ending(int pid) {
  // An open /proc/<pid>/stat names that very process: once it is reaped, reads fail (ESRCH),
  // also if the pid is reused.
  static auto* fds = new PidFds();  // lives with the process
  auto fd = fds->get(pid, [pid] {
    char path[48];
    std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
    return ::open(path, O_RDONLY | O_CLOEXEC);
  });
  if (!fd) return true;
  char buf[1024];
  ssize_t n = ::pread(fd->fd, buf, sizeof buf - 1, 0);
  bool gone = n <= 0;
  bool dying = gone;
  if (!gone) {
    buf[n] = '\0';
    const char* p = std::strrchr(buf, ')');  // the name may hold spaces and parentheses
    if (p == nullptr || p[1] == '\0') {
      dying = true;
    } else {
      char state = p[2];
      // Fields after the state: 9 (flags) is the 6th after it, 31 (the main thread's pending
      // signals) the 28th.
      const char* f = p + 2;
      unsigned long long flags = 0, pending = 0;
      for (int i = 1; i <= 28 && f != nullptr; ++i) {
        f = std::strchr(f, ' ');
        if (f != nullptr) ++f;
        if (f != nullptr && i == 6) flags = std::strtoull(f, nullptr, 10);
        if (f != nullptr && i == 28) pending = std::strtoull(f, nullptr, 10);
      }
      constexpr unsigned long long kPfExiting = 0x4;  // the kernel's PF_EXITING
      // Killed: SIGKILL pending until its main thread takes it, then PF_EXITING while it
      // exits, then a zombie.
      dying = state == 'Z' || state == 'X' || state == 'x' || (flags & kPfExiting) != 0 ||
              (pending & (1ULL << (SIGKILL - 1))) != 0;
    }
  }
  if (gone) fds->forget(pid, fd);
  return dying;
}

}  // namespace detail

bool ending(int pid) {
  int probe = detail::mrelease_probe(pid);
  return probe >= 0 ? probe == 1 : detail::stat_says_ending(pid);
}

void lower_priority(int nice) {
  if (nice <= 0) return;
  pid_t tid = static_cast<pid_t>(::syscall(SYS_gettid));
  errno = 0;
  int now = ::getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
  if (errno != 0) return;
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), std::min(19, now + nice));
}

}  // namespace cma

bool Engine::cma_allowed() {
  const char* env = std::getenv("PODIUM_RDMA_CMA");
  if (env != nullptr && std::string(env) == "0") return false;
  // A seccomp profile (containers) may refuse the calls outright.
  char src[8] = "podium", dst[8] = {};
  iovec local{dst, sizeof dst}, remote{src, sizeof src};
  return ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == sizeof dst &&
         std::memcmp(src, dst, sizeof dst) == 0;
}

std::chrono::microseconds Engine::default_spin() {
  if (const char* env = std::getenv("PODIUM_RDMA_SPIN_US")) {
    char* end = nullptr;
    long long v = std::strtoll(env, &end, 10);
    if (end != env && *end == '\0' && v >= 0) return std::chrono::microseconds(std::min(v, 100000LL));
  }
  return default_copiers() >= kMaxDefaultCopiers ? kDefaultSpin : std::chrono::microseconds(0);
}

size_t Engine::default_copiers() {
  cpu_set_t set;
  CPU_ZERO(&set);
  size_t cpus = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return cpus >= 2 * kMaxDefaultCopiers ? kMaxDefaultCopiers : 1;
}

}  // namespace podium::data
