// Warm blocks for pulled parts (CH-27): see warm_blocks.h.
#include "podium/channel/warm_blocks.h"

#include "podium/base/env.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

namespace podium::channel::internal {
namespace {

using Clock = std::chrono::steady_clock;

struct Kept {
  void* p = nullptr;
  Clock::time_point since;
};

struct Cache {
  std::mutex mu;
  std::multimap<size_t, Kept> by_len;  // guarded by mu
  size_t bytes = 0;                    // guarded by mu
  uint64_t reused = 0;                 // guarded by mu
};

Cache& cache() {
  static auto* c = new Cache();  // lives as long as the process
  return *c;
}

size_t compute_limit() {
  if (auto n = env_number("PODIUM_WARM_RECV_BYTES")) return size_t(*n);
  long pages = ::sysconf(_SC_PHYS_PAGES);
  long page = ::sysconf(_SC_PAGESIZE);
  size_t eighth = pages > 0 && page > 0 ? size_t(pages) * size_t(page) / 8 : 0;
  return std::min<size_t>(size_t{1} << 30, eighth);
}

// Under c.mu: moves the blocks kept longer than kWarmIdle into `out`.
void expire(Cache& c, Clock::time_point now, std::vector<void*>& out) {
  for (auto it = c.by_len.begin(); it != c.by_len.end();) {
    if (now - it->second.since >= kWarmIdle) {
      out.push_back(it->second.p);
      c.bytes -= it->first;
      it = c.by_len.erase(it);
    } else {
      ++it;
    }
  }
}

void free_all(const std::vector<void*>& blocks) {
  for (void* p : blocks) std::free(p);  // outside the lock: munmap of large blocks
}

}  // namespace

size_t warm_limit() {
  static const size_t limit = compute_limit();
  return limit;
}

void* take_warm(size_t len, size_t align, bool* warm) {
  std::vector<void*> old;
  void* p = nullptr;
  if (warm != nullptr) *warm = false;
  if (len >= kWarmMinBytes) {
    auto& c = cache();
    std::lock_guard lock(c.mu);
    expire(c, Clock::now(), old);
    auto it = c.by_len.find(len);
    if (it != c.by_len.end()) {
      p = it->second.p;
      c.bytes -= len;
      ++c.reused;
      c.by_len.erase(it);
    }
  }
  free_all(old);
  if (p != nullptr) {
    if (warm != nullptr) *warm = true;
    return p;
  }
  if (::posix_memalign(&p, align, len) != 0) return nullptr;
  return p;
}

void give_warm(void* p, size_t len) {
  if (p == nullptr) return;
  std::vector<void*> old;
  bool kept = false;
  if (len >= kWarmMinBytes && len <= warm_limit()) {
    auto& c = cache();
    std::lock_guard lock(c.mu);
    auto now = Clock::now();
    expire(c, now, old);
    // Room for it: the oldest blocks go first.
    while (c.bytes + len > warm_limit() && !c.by_len.empty()) {
      auto oldest = std::min_element(c.by_len.begin(), c.by_len.end(), [](const auto& a, const auto& b) {
        return a.second.since < b.second.since;
      });
      old.push_back(oldest->second.p);
      c.bytes -= oldest->first;
      c.by_len.erase(oldest);
    }
    if (c.bytes + len <= warm_limit()) {
      c.by_len.emplace(len, Kept{p, now});
      c.bytes += len;
      kept = true;
    }
  }
  if (!kept) old.push_back(p);
  free_all(old);
}

void sweep_warm() {
  std::vector<void*> old;
  {
    auto& c = cache();
    std::lock_guard lock(c.mu);
    if (c.by_len.empty()) return;
    expire(c, Clock::now(), old);
  }
  free_all(old);
}

WarmCounts warm_counts() {
  auto& c = cache();
  std::lock_guard lock(c.mu);
  return {c.reused, c.by_len.size(), c.bytes};
}

}  // namespace podium::channel::internal
