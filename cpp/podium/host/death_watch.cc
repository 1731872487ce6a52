#include "podium/host/death_watch.h"

#include <dirent.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <fstream>
#include <future>
#include <optional>
#include <sstream>
#include <string>

namespace podium::host {
namespace {

// A slot: the futex word at 0, the robust-list entry (one pointer) at 8, the owner's tid at
// 16 (the kernel clears it from the word when it marks the word).
constexpr size_t kSlotBytes = 64;
constexpr size_t kBytes = (DeathWatch::kSlots + 1) * kSlotBytes;
constexpr long kEntryToWord = -8;  // the word's offset from the entry (robust_list_head)
constexpr unsigned kPfExiting = 0x4;  // PF_EXITING in /proc/PID/stat's flags

std::atomic<uint32_t>* word_at(void* base, size_t slot) {
  return reinterpret_cast<std::atomic<uint32_t>*>(static_cast<char*>(base) + slot * kSlotBytes);
}

std::atomic<uint32_t>* tid_at(void* base, size_t slot) {
  return reinterpret_cast<std::atomic<uint32_t>*>(static_cast<char*>(base) + slot * kSlotBytes +
                                                  16);
}

long futex_wake(void* addr, bool shared) {
  return ::syscall(SYS_futex, addr, shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
                   nullptr, 0);
}

struct ThreadStat {
  char state = '?';
  unsigned flags = 0;
  int exit_code = 0;
};

// Fields 3, 9 and 52 of a thread's stat: its state, flags and exit code.
std::optional<ThreadStat> read_stat(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (!std::getline(f, line)) return std::nullopt;
  auto close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream in(line.substr(close + 1));
  std::vector<std::string> fields;  // fields[0] is field 3 (the state)
  for (std::string s; in >> s;) fields.push_back(std::move(s));
  if (fields.size() < 50) return std::nullopt;
  return ThreadStat{fields[0][0],
                    static_cast<unsigned>(std::strtoul(fields[6].c_str(), nullptr, 10)),
                    std::atoi(fields[49].c_str())};
}

// What the stats say of a process whose watch thread `tid` has marked its word (DW-1): its
// wait status once certain; kPending while it may still become so; kNever for an exec (which
// marks the word too) or a process already reaped (the reap tells).
constexpr int kPending = -1;
constexpr int kNever = -2;

// The thread set its exit code before the kernel marked the word, so its stat is
// authoritative while it lasts; a thread other than the leader is released right after it
// exits, and then the leader tells: a zombie leader holds the process's status, an exiting one
// a non-zero status once set (0 could still be "not yet").
int exit_status_of(pid_t pid, pid_t tid) {
  std::string proc = "/proc/" + std::to_string(pid);
  if (auto t = read_stat(proc + "/task/" + std::to_string(tid) + "/stat")) {
    return (t->flags & kPfExiting) ? t->exit_code : kNever;
  }
  auto l = read_stat(proc + "/stat");
  if (!l) return kNever;
  if (l->state == 'Z' || l->state == 'X') return l->exit_code;
  if ((l->flags & kPfExiting) && l->exit_code != 0) return l->exit_code;
  return kPending;  // its other threads are still on their way out
}

}  // namespace

// DW-3: every thread of `pid` still listed goes to nice 19. The thread that drops the last
// reference to the memory tears it down (exit_mmap) at its own priority.
void DeathWatch::lower_dying(pid_t pid) {
  std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;  // reaped already: nothing left to tear down
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    // ESRCH for a thread gone meanwhile; a process of ours may always be lowered.
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(std::atoi(e->d_name)), kDyingNice);
  }
  ::closedir(d);
}

Result<std::unique_ptr<DeathWatch>> DeathWatch::create() {
  // futex_waitv (Linux 5.16): EINVAL for an empty vector where it exists.
  if (::syscall(SYS_futex_waitv, nullptr, 0, 0, nullptr, CLOCK_MONOTONIC) == 0 || errno == ENOSYS) {
    return std::unexpected(make_error(HostErrc::kSpawnFailed, "death watch: no futex_waitv"));
  }
  int fd = ::memfd_create("podium-death-watch", MFD_CLOEXEC);
  if (fd < 0) return std::unexpected(errno_error("death watch: memfd_create", errno));
  if (::ftruncate(fd, kBytes) != 0) {
    int err = errno;
    ::close(fd);
    return std::unexpected(errno_error("death watch: ftruncate", err));
  }
  void* base = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    int err = errno;
    ::close(fd);
    return std::unexpected(errno_error("death watch: mmap", err));
  }
  return std::unique_ptr<DeathWatch>(new DeathWatch(fd, base));
}

DeathWatch::DeathWatch(int fd, void* base) : fd_(fd), base_(base), slots_(kSlots) {
  thread_ = std::thread([this] { loop(); });
}

DeathWatch::~DeathWatch() {
  stop();
  ::munmap(base_, kBytes);
  ::close(fd_);
}

std::string DeathWatch::env_value(size_t slot) {
  return std::to_string(kChildFd) + ":" + std::to_string(slot);
}

std::optional<size_t> DeathWatch::reserve() {
  std::lock_guard lock(mu_);
  if (stopping_) return std::nullopt;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i].reserved) {
      slots_[i] = Watched{};
      slots_[i].reserved = true;
      word_at(base_, i)->store(0);
      tid_at(base_, i)->store(0);
      return i;
    }
  }
  return std::nullopt;
}

void DeathWatch::watch(size_t slot, pid_t pid, OnDying on_dying) {
  {
    std::lock_guard lock(mu_);
    if (slot >= slots_.size() || !slots_[slot].reserved) return;
    slots_[slot].pid = pid;
    slots_[slot].told = false;
    slots_[slot].on_dying = std::move(on_dying);
  }
  bump();
}

void DeathWatch::release(size_t slot) {
  {
    std::lock_guard lock(mu_);
    if (slot >= slots_.size()) return;
    slots_[slot] = Watched{};
    word_at(base_, slot)->store(0);  // DW-2
    tid_at(base_, slot)->store(0);
  }
  bump();
}

void DeathWatch::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  bump();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void DeathWatch::bump() {
  control_.fetch_add(1);
  futex_wake(&control_, false);
}

void DeathWatch::loop() {
  std::vector<futex_waitv> waits;
  std::vector<std::pair<size_t, pid_t>> watched;
  while (true) {
    uint32_t control = control_.load();
    watched.clear();
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      for (size_t i = 0; i < slots_.size(); ++i) {
        if (slots_[i].pid > 0 && !slots_[i].told) watched.emplace_back(i, slots_[i].pid);
      }
    }
    waits.clear();
    waits.push_back(futex_waitv{control, reinterpret_cast<uintptr_t>(&control_),
                                FUTEX_32 | FUTEX_PRIVATE_FLAG, 0});
    bool marked = false;
    for (auto [slot, pid] : watched) {
      auto* w = word_at(base_, slot);
      uint32_t v = w->load();
      if (v & FUTEX_OWNER_DIED) {
        marked = marked || !pending_;  // a pending one is looked at again after the timeout
        continue;
      }
      // Attached: ask the kernel to wake us when it marks the word (it wakes only waiters).
      // Not yet: the child wakes the word once it has written its tid.
      if ((v & FUTEX_TID_MASK) != 0 && !(v & FUTEX_WAITERS)) {
        if (!w->compare_exchange_strong(v, v | FUTEX_WAITERS)) {
          marked = true;  // it changed: look again
          continue;
        }
        v |= FUTEX_WAITERS;
      }
      waits.push_back(futex_waitv{v, reinterpret_cast<uintptr_t>(w), FUTEX_32, 0});
    }
    if (!marked) {
      // Woken, EAGAIN (a word changed), EINTR or, with a dying process whose status is not
      // certain yet, after 200 us: look again.
      timespec until{};
      if (pending_) {
        ::clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += 200'000;
        if (until.tv_nsec >= 1'000'000'000) {
          until.tv_sec += 1;
          until.tv_nsec -= 1'000'000'000;
        }
      }
      ::syscall(SYS_futex_waitv, waits.data(), static_cast<unsigned>(waits.size()), 0,
                pending_ ? &until : nullptr, CLOCK_MONOTONIC);
    }
    pending_ = false;
    for (auto [slot, pid] : watched) {
      uint32_t v = word_at(base_, slot)->load();
      if (!(v & FUTEX_OWNER_DIED)) continue;
      int raw = exit_status_of(pid, static_cast<pid_t>(tid_at(base_, slot)->load()));
      if (raw == kPending) {
        pending_ = true;
        continue;
      }
      OnDying cb;
      {
        std::lock_guard lock(mu_);
        if (stopping_) return;
        Watched& s = slots_[slot];
        if (s.pid != pid || s.told) continue;  // released and reused meanwhile (DW-2)
        s.told = true;
        // DW-1: only an exit that has begun (an exec marks the word too), with its status.
        if (raw != kNever) cb = std::move(s.on_dying);
      }
      if (!cb) continue;
      ExitStatus st;
      st.pid = pid;
      st.signaled = (raw & 0x7f) != 0;
      st.code = st.signaled ? (raw & 0x7f) : ((raw >> 8) & 0xff);
      st.core_dumped = st.signaled && (raw & 0x80) != 0;
      cb(st);
    }
  }
}

Status attach_death_watch() {
  const char* v = std::getenv(DeathWatch::kEnv);
  if (v == nullptr || *v == '\0') {
    ::unsetenv(DeathWatch::kEnv);
    return ok();
  }
  std::string spec(v);
  ::unsetenv(DeathWatch::kEnv);  // the programs this proc starts are not watched through it
  auto colon = spec.find(':');
  int fd = std::atoi(spec.substr(0, colon).c_str());
  size_t slot = colon == std::string::npos ? DeathWatch::kSlots
                                           : std::strtoul(spec.c_str() + colon + 1, nullptr, 10);
  struct stat st{};
  if (slot >= DeathWatch::kSlots || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<size_t>(st.st_size) != kBytes) {
    return std::unexpected(make_error(HostErrc::kInvalidSpec,
                                      "death watch: " + spec + " is not a watch slot"));
  }
  void* base = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (base == MAP_FAILED) return std::unexpected(errno_error("death watch: mmap", err));
  auto registered = std::make_shared<std::promise<bool>>();
  auto done = registered->get_future();
  std::thread([base, slot, registered] {
    sigset_t all;
    sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, nullptr);  // the process's signals go to other threads
    // This thread's robust list holds only the slot's word: when the thread exits (with the
    // process, however it ends), the kernel marks it FUTEX_OWNER_DIED and wakes the watcher.
    static robust_list_head head;
    auto* entry = reinterpret_cast<robust_list*>(static_cast<char*>(base) + slot * kSlotBytes + 8);
    entry->next = &head.list;
    head.list.next = entry;
    head.futex_offset = kEntryToWord;
    head.list_op_pending = nullptr;
    if (::syscall(SYS_set_robust_list, &head, sizeof head) != 0) {
      registered->set_value(false);
      return;
    }
    auto* w = word_at(base, slot);
    tid_at(base, slot)->store(static_cast<uint32_t>(::gettid()));
    w->store(static_cast<uint32_t>(::gettid()));
    futex_wake(w, true);
    registered->set_value(true);
    while (true) ::pause();
  }).detach();
  // Watched from here on: a proc that dies right after is told early too.
  if (done.wait_for(std::chrono::seconds(10)) != std::future_status::ready || !done.get()) {
    return std::unexpected(
        make_error(HostErrc::kInvalidSpec, "death watch: set_robust_list failed"));
  }
  return ok();
}

}  // namespace podium::host
