// Same-host shared pages (DA-29) and the reader's windows on them (DA-30): see shm.h.
#include "podium/data/shm.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <poll.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "podium/base/env.h"
#include "podium/data/errc.h"
#include "podium/data/shm_maps.h"

namespace podium::data::shm {

size_t page_size() {
  static const size_t p = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return p;
}

namespace {

constexpr char kName[] = "podium-rdma";

Error sys_error(std::string_view what, int err) {
  return make_error(DataErrc::kUnavailable, std::string(what) + ": " + std::strerror(err));
}

// A range whose last SharedPages ended, waiting to be given back (DA-32).
struct Returned {
  int fd = -1;
  uint64_t begin = 0, end = 0;
  std::shared_ptr<const void> keep;
};

// The live SharedPages of this process, by their first address (DA-29: a second region inside
// one of them shares it; one that overlaps it partly is not moved), and the ranges to give back.
// One mutex serialises every move and every give-back, so a range is never moved while an
// earlier move of it is being given back.
struct Live {
  std::mutex mu;
  std::condition_variable cv;  // with mu: returns queued, or one finished
  std::map<uint64_t, std::weak_ptr<SharedPages>> by_begin;
  std::deque<Returned> returns;
  bool returner = false;  // the podium-shm thread runs
  size_t busy = 0;        // give-backs running now
  uint64_t given_back = 0;
};
Live& live() {
  static auto* l = new Live();  // lives as long as the process (its thread uses it)
  return *l;
}

// DA-32, under live().mu: the range becomes private memory again, its bytes kept.
void give_back(const Returned& r) {
  const uint64_t page = page_size();
  size_t len = r.end - r.begin;
  void* at = ::mmap(reinterpret_cast<void*>(r.begin), len, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_FIXED, r.fd, 0);
  if (at == MAP_FAILED) {
    // The shared mapping stays, and with it the memfd: correct memory, shared on fork.
    std::fprintf(stderr, "podium: could not give back %zu bytes of shared pages at %p (%s); "
                         "they stay shared\n", len, reinterpret_cast<void*>(r.begin),
                 std::strerror(errno));
    ::close(r.fd);
    return;
  }
  for (uint64_t p = r.begin; p < r.end; p += page) {
    // A write fault copies the page out of the memfd; adding 0 atomically loses no racing write.
    __atomic_fetch_add(reinterpret_cast<uint64_t*>(p), uint64_t{0}, __ATOMIC_SEQ_CST);
  }
  (void)::fallocate(r.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                    static_cast<off_t>(len));
  ::close(r.fd);
}

// Runs the queued give-backs, under `lock` (of live().mu).
void drain(std::unique_lock<std::mutex>& lock) {
  auto& l = live();
  while (!l.returns.empty()) {
    Returned r = std::move(l.returns.front());
    l.returns.pop_front();
    ++l.busy;
    give_back(r);
    --l.busy;
    ++l.given_back;
    auto keep = std::move(r.keep);
    lock.unlock();  // the memory may be freed now, outside the lock
    keep.reset();
    lock.lock();
  }
  l.cv.notify_all();
}

void returner_loop() {
  pthread_setname_np(pthread_self(), "podium-shm");
  auto& l = live();
  std::unique_lock lock(l.mu);
  for (;;) {
    l.cv.wait(lock, [&] { return !l.returns.empty(); });
    drain(lock);
  }
}

// Runs `io(done)` (a pread or pwrite of what is left, at offset `done`) until `len` bytes
// went through: 0, or the errno.
template <class Io>
int whole(size_t len, Io io) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = io(done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : EIO;
    done += static_cast<size_t>(n);
  }
  return 0;
}

// pwrite(2) of all `len` bytes at offset 0 of `fd` (0, or the errno).
int write_all(int fd, const std::byte* from, size_t len) {
  return whole(len, [&](size_t done) {
    return ::pwrite(fd, from + done, len - done, static_cast<off_t>(done));
  });
}

// pread(2) of all `len` bytes at offset 0 of `fd` (0, or the errno).
int read_all(int fd, std::byte* to, size_t len) {
  return whole(len, [&](size_t done) {
    return ::pread(fd, to + done, len - done, static_cast<off_t>(done));
  });
}

}  // namespace

SharedPages::~SharedPages() {
  if (ref_.fd < 0) return;
  if (ref_.end <= ref_.begin) {
    ::close(ref_.fd);
    return;
  }
  auto& l = live();
  if (!keep_) {
    // Nothing holds the memory but its owner, who may free it once this returns: given back
    // here, before that (after those queued earlier, which may share its pages' history).
    std::unique_lock lock(l.mu);
    drain(lock);
    give_back(Returned{ref_.fd, ref_.begin, ref_.end, nullptr});
    ++l.given_back;
    return;
  }
  std::lock_guard lock(l.mu);
  l.returns.push_back(Returned{ref_.fd, ref_.begin, ref_.end, std::move(keep_)});
  if (!l.returner) {
    l.returner = true;
    std::thread(returner_loop).detach();  // lives as long as the process
  }
  l.cv.notify_all();
}

void wait_given_back() {
  auto& l = live();
  std::unique_lock lock(l.mu);
  drain(lock);
  l.cv.wait(lock, [&] { return l.returns.empty() && l.busy == 0; });
}

size_t live_count() {
  auto& l = live();
  std::lock_guard lock(l.mu);
  size_t n = 0;
  for (const auto& [b, w] : l.by_begin) n += w.expired() ? 0 : 1;
  return n;
}

uint64_t given_back_count() {
  auto& l = live();
  std::lock_guard lock(l.mu);
  return l.given_back;
}

Mode mode() {
  const char* env = std::getenv("PODIUM_RDMA_SHM");
  if (env == nullptr || *env == '\0') return Mode::kAuto;
  std::string_view v(env);
  if (v == "0") return Mode::kOff;
  if (v == "1") return Mode::kOn;
  return Mode::kAuto;
}

bool enabled() { return mode() != Mode::kOff; }

size_t min_bytes() {
  auto v = env_number("PODIUM_RDMA_SHM_MIN_BYTES");
  return v && *v > 0 ? static_cast<size_t>(*v) : kDefaultMinBytes;
}

Result<std::shared_ptr<SharedPages>> share_pages(const void* addr, size_t size,
                                                 size_t min_bytes,
                                                 std::shared_ptr<const void> keep) {
  const uint64_t page = page_size();
  uint64_t a = reinterpret_cast<uint64_t>(addr);
  uint64_t begin = (a + page - 1) & ~(page - 1);
  uint64_t end = (a + size) & ~(page - 1);
  if (end <= begin || end - begin < std::max<uint64_t>(min_bytes, page)) return nullptr;
  auto& l = live();
  std::vector<std::shared_ptr<SharedPages>> seen;  // released after the lock (their destructor locks)
  std::unique_lock lock(l.mu);  // one move at a time: two regions never race for one page
  drain(lock);  // DA-32: what ended is given back before anything is moved again
  // A live SharedPages that holds these pages, or overlaps them.
  auto it = l.by_begin.upper_bound(end - 1);
  while (it != l.by_begin.begin()) {
    --it;
    auto held = it->second.lock();
    if (!held) continue;
    seen.push_back(held);
    const auto& r = held->ref();
    if (r.end <= begin) break;  // sorted by begin, and they never overlap each other
    if (r.begin <= begin && end <= r.end) return held;  // DA-29: shares it
    return nullptr;  // partly inside another: left as it is
  }
  for (auto i = l.by_begin.begin(); i != l.by_begin.end();) {
    i = i->second.expired() ? l.by_begin.erase(i) : std::next(i);
  }
  if (!detail::movable(begin, end, mode() != Mode::kOn)) return nullptr;
  size_t len = end - begin;
  int fd = ::memfd_create(kName, MFD_CLOEXEC);
  if (fd < 0) return std::unexpected(sys_error("memfd_create", errno));
  std::shared_ptr<SharedPages> sp(new SharedPages());
  sp->ref_.fd = fd;  // closed by the destructor until the pages are moved
  if (::ftruncate(fd, static_cast<off_t>(len)) != 0) {
    return std::unexpected(sys_error("ftruncate of a " + std::to_string(len) + "-byte memfd", errno));
  }
  // The bytes go in with write(2): the kernel allocates each page of the memfd as it copies
  // into it, where a copy through a mapping of the memfd took a page fault and a clearing of
  // each fresh page first (half the time of a move on the 2-core VM, docs/data_figures.md).
  if (int err = write_all(fd, reinterpret_cast<const std::byte*>(begin), len)) {
    return std::unexpected(sys_error("write of a buffer's pages into its memfd", err));
  }
  void* at = ::mmap(reinterpret_cast<void*>(begin), len, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd, 0);
  if (at == MAP_FAILED) {
    int err = errno;
    // The kernel may have unmapped the old pages already: put private ones back, with the bytes.
    void* back = ::mmap(reinterpret_cast<void*>(begin), len, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (back == MAP_FAILED || read_all(fd, static_cast<std::byte*>(back), len) != 0) {
      std::fprintf(stderr, "podium: lost %zu bytes of memory at %p while sharing them (%s)\n",
                   len, reinterpret_cast<void*>(begin), std::strerror(err));
      std::abort();
    }
    return std::unexpected(sys_error("mmap over the buffer's pages", err));
  }
  struct stat st{};
  (void)::fstat(fd, &st);
  sp->ref_.ino = st.st_ino;
  sp->ref_.dev = st.st_dev;
  sp->ref_.begin = begin;
  sp->ref_.end = end;
  sp->keep_ = std::move(keep);
  l.by_begin[begin] = sp;
  return sp;
}

Window::~Window() {
  if (base_ != nullptr) ::munmap(base_, ref_.end - ref_.begin);
  if (pidfd_ >= 0) ::close(pidfd_);
}

bool Window::owner_alive() const {
  pollfd p{pidfd_, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

Result<std::shared_ptr<Window>> open_window(pid_t pid, const WindowRef& ref) {
  if (!ref.valid()) {
    return std::unexpected(make_error(DataErrc::kInvalidArgument, "no shared pages named"));
  }
  std::shared_ptr<Window> w(new Window());
  w->ref_ = ref;
  w->pid_ = pid;
  w->pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (w->pidfd_ < 0) return std::unexpected(sys_error("pidfd_open", errno));
  int fd = static_cast<int>(::syscall(SYS_pidfd_getfd, w->pidfd_, ref.fd, 0));
  if (fd < 0) {
    // Older kernels: the owner's descriptor through /proc (the same permission check).
    std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(ref.fd);
    fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return std::unexpected(sys_error("pidfd_getfd of the owner's shared pages", errno));
  }
  struct stat st{};
  size_t len = ref.end - ref.begin;
  bool same = ::fstat(fd, &st) == 0 && st.st_ino == ref.ino && st.st_dev == ref.dev &&
              static_cast<uint64_t>(st.st_size) >= len;
  if (!same) {  // DA-30: the owner closed it, and the number names something else now
    ::close(fd);
    return std::unexpected(make_error(DataErrc::kUnavailable,
                                      "the owner's descriptor " + std::to_string(ref.fd) +
                                          " is not the buffer's shared pages any more"));
  }
  void* base = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (base == MAP_FAILED) return std::unexpected(sys_error("mmap of the owner's shared pages", err));
  w->base_ = static_cast<std::byte*>(base);
  return w;
}

std::shared_ptr<const Window> WindowCache::get(pid_t pid, const WindowRef& ref,
                                               Clock::time_point now) {
  Key key{pid, ref.fd, ref.ino, ref.dev, ref.begin, ref.end};
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      // Whether the owner still runs is asked by the copy (DA-33 before it, the pidfd after
      // it), and an ended owner's window goes with the next sweep: no system call here.
      it->second.used = now;
      return it->second.window;
    }
  }
  auto w = open_window(pid, ref);  // outside the lock: system calls, a populate
  std::shared_ptr<const Window> win = w ? std::shared_ptr<const Window>(std::move(*w)) : nullptr;
  std::lock_guard lock(mu_);
  auto [it, fresh] = entries_.try_emplace(key, Entry{win, now});
  if (!fresh) it->second.used = now;
  return it->second.window;
}

size_t WindowCache::sweep(Clock::time_point now, Clock::duration idle) {
  std::vector<std::shared_ptr<const Window>> gone;  // unmapped after the lock is released
  std::lock_guard lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    const auto& e = it->second;
    bool held = e.window && e.window.use_count() > 1;
    bool ended = e.window && !e.window->owner_alive();
    if ((!held && now - e.used >= idle) || (ended && !held)) {
      gone.push_back(std::move(it->second.window));
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  size_t left = entries_.size();
  return left;
}

size_t WindowCache::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace podium::data::shm
