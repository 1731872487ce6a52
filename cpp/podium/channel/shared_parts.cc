// Large parts copied into shared blocks (CH-29): see shared_parts.h.
#include "podium/channel/shared_parts.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "podium/base/env.h"
#include "podium/channel/pull.h"
#include "podium/channel/warm_blocks.h"

namespace podium::channel::internal {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x5053'6d75'6964'6f70;  // "podiumSP"
constexpr size_t kHeaderBytes = 4096;               // data starts on a page of its own
constexpr size_t kClassBytes = size_t{64} << 10;    // blocks are reused for one size class
constexpr size_t kMaxBlockBytes = size_t{1} << 40;
constexpr size_t kMaxBlocks = 64;  // descriptors held for blocks, at most
constexpr uint64_t kFree = 0, kLent = 1, kHeld = 2;
constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

struct Header {
  uint64_t magic;
  std::atomic<uint64_t> word;  // generation << 2 | state
};

Header* header_at(std::byte* base) { return reinterpret_cast<Header*>(base); }

// ---- the sender's side ----------------------------------------------------------------

struct Block {
  int fd = -1;
  uint64_t ino = 0;
  size_t cap = 0;
  std::byte* base = nullptr;
  bool busy = false;       // a Buffer of the sender refers to it; guarded by Sender::mu
  Clock::time_point used;  // guarded by Sender::mu

  ~Block() {
    if (base != nullptr) ::munmap(base, kHeaderBytes + cap);
    if (fd >= 0) ::close(fd);
  }
  Header* header() const { return header_at(base); }
  std::byte* data() const { return base + kHeaderBytes; }
};

struct Sender {
  std::mutex mu;
  std::vector<std::shared_ptr<Block>> blocks;  // guarded by mu
  size_t bytes = 0;                            // guarded by mu: blocks' caps and reservations
  uint64_t gen = 0, copied = 0, made = 0;      // guarded by mu
};

// Each side's state, for the life of the process; a forked child starts afresh (after_fork).
std::atomic<Sender*> g_sender{new Sender()};
Sender& sender() { return *g_sender.load(std::memory_order_acquire); }

// Under s.mu: moves the blocks nobody used for kSharedIdle into `old`.
void expire(Sender& s, Clock::time_point now, std::vector<std::shared_ptr<Block>>& old) {
  std::erase_if(s.blocks, [&](std::shared_ptr<Block>& b) {
    if (b->busy || now - b->used < kSharedIdle) return false;
    s.bytes -= b->cap;
    old.push_back(std::move(b));
    return true;
  });
}

std::shared_ptr<Block> make_block(size_t cap) {
  auto b = std::make_shared<Block>();
  b->cap = cap;
  b->fd = ::memfd_create("podium-part", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (b->fd < 0) return nullptr;
  struct stat st{};
  // Sealed at its size: a receiver's mapping never loses its pages under it (SIGBUS).
  if (::ftruncate(b->fd, off_t(kHeaderBytes + cap)) != 0 ||
      ::fcntl(b->fd, F_ADD_SEALS, kSeals) != 0 || ::fstat(b->fd, &st) != 0) {
    return nullptr;
  }
  b->ino = uint64_t(st.st_ino);
  void* p = ::mmap(nullptr, kHeaderBytes + cap, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                   b->fd, 0);
  if (p == MAP_FAILED) return nullptr;
  b->base = static_cast<std::byte*>(p);
  b->header()->magic = kMagic;
  b->header()->word.store(kFree, std::memory_order_relaxed);
  return b;
}

// A free block of `cap` bytes, busy now, and the generation of its next copy; null when the
// limit leaves no room or no memory is left.
std::shared_ptr<Block> take_block(size_t cap, uint64_t& gen) {
  auto& s = sender();
  std::vector<std::shared_ptr<Block>> old;  // closed after the lock is released
  std::shared_ptr<Block> b;
  bool make = false;
  {
    std::lock_guard lock(s.mu);
    auto now = Clock::now();
    expire(s, now, old);
    for (auto& k : s.blocks) {
      if (!k->busy && k->cap == cap &&
          (k->header()->word.load(std::memory_order_acquire) & 3) == kFree) {
        b = k;
        break;
      }
    }
    if (!b) {
      // Room for a new one: the blocks used longest ago go first (one a receiver still holds
      // is only forgotten here; its pages go when the receiver releases it).
      while (s.bytes + cap > shared_limit() || s.blocks.size() >= kMaxBlocks) {
        auto oldest = s.blocks.end();
        for (auto it = s.blocks.begin(); it != s.blocks.end(); ++it) {
          if (!(*it)->busy && (oldest == s.blocks.end() || (*it)->used < (*oldest)->used)) {
            oldest = it;
          }
        }
        if (oldest == s.blocks.end()) break;
        s.bytes -= (*oldest)->cap;
        old.push_back(std::move(*oldest));
        s.blocks.erase(oldest);
      }
      if (s.bytes + cap > shared_limit() || s.blocks.size() >= kMaxBlocks) return nullptr;
      s.bytes += cap;  // reserved while it is made
      make = true;
    } else {
      b->busy = true;
      b->used = now;
    }
    gen = ++s.gen;
  }
  old.clear();
  if (!make) return b;
  b = make_block(cap);  // outside the lock: system calls, pages allocated
  std::lock_guard lock(s.mu);
  if (!b) {
    s.bytes -= cap;
    return nullptr;
  }
  b->busy = true;
  b->used = Clock::now();
  s.blocks.push_back(b);
  ++s.made;
  return b;
}

// The sender's Buffer over a block: released once the receiver acked or the envelope was
// handed back. A copy the receiver never claimed is free from then on (CH-29).
struct SenderRelease {
  std::shared_ptr<Block> block;
  uint64_t gen = 0;
  pid_t pid = 0;  // the process that copied
  void operator()(const void*) const {
    if (::getpid() != pid) return;  // a forked child's copy of the Buffer: not its block
    uint64_t lent = gen << 2 | kLent;
    block->header()->word.compare_exchange_strong(lent, gen << 2 | kFree,
                                                  std::memory_order_acq_rel);
    auto& s = sender();
    std::lock_guard lock(s.mu);
    block->busy = false;
    block->used = Clock::now();
  }
};

// ---- the receiver's side --------------------------------------------------------------

struct Mapping {
  std::byte* base = nullptr;
  size_t len = 0;
  ~Mapping() {
    if (base != nullptr) ::munmap(base, len);
  }
};

using Key = std::tuple<pid_t, int32_t, uint64_t>;

struct Entry {
  std::shared_ptr<Mapping> m;
  bool in_use = false;
  Clock::time_point used;
};

struct Receiver {
  std::mutex mu;
  std::map<Key, Entry> entries;  // guarded by mu
  uint64_t mapped = 0, failed = 0;
};

std::atomic<Receiver*> g_receiver{new Receiver()};
Receiver& receiver() { return *g_receiver.load(std::memory_order_acquire); }

// Forks. A child shares every block mapped at the fork with its parent (MAP_SHARED): a part
// the parent holds must then never be freed for its sender to write again, since the child
// may still read it where its parent let it go; and the child must neither write nor free
// blocks that are its parent's. So a release in another process than the claim or the copy
// does nothing, a receiver that forked since it claimed a block leaves it held (the sender
// forgets it once idle, its pages go with the last mapping), and a child starts with no
// blocks and no mappings of its own (the old state is left to the parent).
std::atomic<uint64_t> g_forks{0};

void watch_forks() {
  static std::once_flag once;
  std::call_once(once, [] {
    ::pthread_atfork([] { g_forks.fetch_add(1, std::memory_order_acq_rel); }, nullptr, [] {
      g_sender.store(new Sender(), std::memory_order_release);
      g_receiver.store(new Receiver(), std::memory_order_release);
    });
  });
}

void expire(Receiver& r, Clock::time_point now, std::vector<std::shared_ptr<Mapping>>& old) {
  for (auto it = r.entries.begin(); it != r.entries.end();) {
    if (!it->second.in_use && now - it->second.used >= kSharedIdle) {
      old.push_back(std::move(it->second.m));
      it = r.entries.erase(it);
    } else {
      ++it;
    }
  }
}

// The sender's block named by `l`, mapped here: its descriptor taken from the sender (the
// permission CMA asks), checked to be the sealed memfd named, of a size that holds the part.
std::shared_ptr<Mapping> open_block(pid_t pid, const wire::LentPart& l) {
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  int fd = pidfd < 0 ? -1 : static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, l.fd, 0));
  if (pidfd >= 0) ::close(pidfd);
  if (fd < 0) {
    std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(l.fd);
    fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return nullptr;
  }
  struct stat st{};
  int seals = ::fcntl(fd, F_GET_SEALS);
  bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && uint64_t(st.st_ino) == l.ino &&
            seals >= 0 && (unsigned(seals) & (F_SEAL_SHRINK | F_SEAL_GROW)) != 0 &&
            uint64_t(st.st_size) >= kHeaderBytes && uint64_t(st.st_size) - kHeaderBytes >= l.len &&
            uint64_t(st.st_size) <= kHeaderBytes + kMaxBlockBytes;
  if (!ok) {
    ::close(fd);
    return nullptr;
  }
  auto m = std::make_shared<Mapping>();
  m->len = size_t(st.st_size);
  void* p = ::mmap(nullptr, m->len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return nullptr;
  m->base = static_cast<std::byte*>(p);
  if (header_at(m->base)->magic != kMagic) return nullptr;
  return m;
}

// The receiver's Buffer over a claimed block: its release frees the block for the sender.
struct ReceiverRelease {
  std::shared_ptr<Mapping> m;
  uint64_t gen = 0;
  Key key;
  pid_t pid = 0;       // the process that claimed
  uint64_t forks = 0;  // g_forks when it claimed
  void operator()(const void*) const {
    if (::getpid() != pid) return;  // a forked child's copy of the Buffer
    // A child forked since may still read the block: it stays held, never written again.
    if (g_forks.load(std::memory_order_acquire) == forks) {
      header_at(m->base)->word.store(gen << 2 | kFree, std::memory_order_release);
    }
    auto& r = receiver();
    std::lock_guard lock(r.mu);
    auto it = r.entries.find(key);
    if (it != r.entries.end() && it->second.m == m) {
      it->second.in_use = false;
      it->second.used = Clock::now();
    }
  }
};

}  // namespace

size_t shared_limit() {
  static const size_t limit =
      size_t(env_number("PODIUM_SHARED_SEND_BYTES").value_or(warm_limit()));
  return limit;
}

void share_parts(wire::Envelope& env, size_t min_bytes) {
  if (min_bytes == 0) return;
  for (size_t i = 0; i < env.parts.size(); ++i) {
    Buffer& p = env.parts[i];
    if (p.size() < min_bytes || p.size() > kMaxBlockBytes) continue;
    size_t cap = (p.size() + kClassBytes - 1) / kClassBytes * kClassBytes;
    if (cap > shared_limit()) continue;
    static std::once_flag sweeper;
    // Idle blocks go even if this process never sends a large part again (the pullers sweep).
    std::call_once(sweeper, start_pullers);
    watch_forks();
    uint64_t gen = 0;
    auto b = take_block(cap, gen);
    if (!b) continue;
    std::memcpy(b->data(), p.data(), p.size());
    b->header()->word.store(gen << 2 | kLent, std::memory_order_release);
    size_t len = p.size();
    p = Buffer(std::shared_ptr<const void>(b->data(), SenderRelease{b, gen, ::getpid()}),
               b->data(), len);
    env.shared.push_back({uint32_t(i), int32_t(b->fd), b->ino, gen});
    auto& s = sender();
    std::lock_guard lock(s.mu);
    ++s.copied;
  }
}

std::optional<Buffer> map_shared(pid_t pid, const wire::LentPart& l, bool mapped_only) {
  if (l.fd < 0 || l.gen == 0 || l.gen >= (uint64_t{1} << 62)) return std::nullopt;
  watch_forks();
  auto& r = receiver();
  Key key{pid, l.fd, l.ino};
  std::vector<std::shared_ptr<Mapping>> old;  // unmapped after the lock is released
  std::shared_ptr<Mapping> m;
  auto fail = [&] {
    std::lock_guard lock(r.mu);
    ++r.failed;
    if (m) {
      auto it = r.entries.find(key);
      if (it != r.entries.end() && it->second.m == m) it->second.in_use = false;
    }
    return std::nullopt;
  };
  {
    std::lock_guard lock(r.mu);
    expire(r, Clock::now(), old);
    auto it = r.entries.find(key);
    if (it != r.entries.end()) {
      if (it->second.in_use) {
        ++r.failed;
        return std::nullopt;
      }
      it->second.in_use = true;
      it->second.used = Clock::now();
      m = it->second.m;
    } else if (mapped_only) {
      return std::nullopt;  // not a failure: the pullers map it
    }
  }
  old.clear();
  if (!m) {
    auto fresh = open_block(pid, l);  // outside the lock: system calls, a populate
    if (!fresh) return fail();
    std::lock_guard lock(r.mu);
    auto [it, added] = r.entries.try_emplace(key, Entry{fresh, true, Clock::now()});
    if (!added) {
      if (it->second.in_use) {
        ++r.failed;
        return std::nullopt;
      }
      it->second = Entry{fresh, true, Clock::now()};
    }
    m = fresh;
  }
  if (m->len - kHeaderBytes < l.len) return fail();
  uint64_t lent = l.gen << 2 | kLent;
  uint64_t forks = g_forks.load(std::memory_order_acquire);  // before the claim
  if (!header_at(m->base)->word.compare_exchange_strong(lent, l.gen << 2 | kHeld,
                                                        std::memory_order_acq_rel)) {
    return fail();
  }
  {
    std::lock_guard lock(r.mu);
    ++r.mapped;
  }
  std::byte* data = m->base + kHeaderBytes;
  return Buffer::received(
      std::shared_ptr<const void>(data, ReceiverRelease{m, l.gen, key, ::getpid(), forks}), data,
      l.len);
}

void sweep_shared() {
  std::vector<std::shared_ptr<Block>> blocks;
  std::vector<std::shared_ptr<Mapping>> maps;
  auto now = Clock::now();
  {
    auto& s = sender();
    std::lock_guard lock(s.mu);
    expire(s, now, blocks);
  }
  {
    auto& r = receiver();
    std::lock_guard lock(r.mu);
    expire(r, now, maps);
  }
}

SharedCounts shared_counts() {
  SharedCounts c;
  {
    auto& s = sender();
    std::lock_guard lock(s.mu);
    c.copied = s.copied;
    c.blocks_made = s.made;
    c.blocks = s.blocks.size();
    c.bytes = s.bytes;
  }
  auto& r = receiver();
  std::lock_guard lock(r.mu);
  c.mapped = r.mapped;
  c.map_failed = r.failed;
  c.mappings = r.entries.size();
  return c;
}

}  // namespace podium::channel::internal
