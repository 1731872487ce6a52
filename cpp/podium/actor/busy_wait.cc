#include "podium/actor/busy_wait.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cstdlib>

namespace podium::actor {
namespace {

// The cores this process may run on (its affinity mask), at least 1.
unsigned usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return static_cast<unsigned>(n);
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<unsigned>(n) : 1;
}

// The load verdict (AC-20): when it was taken (steady-clock ns; 0: never) and what it was.
std::atomic<int64_t> g_load_checked_ns{0};
std::atomic<bool> g_spare{true};

// Reads /proc/loadavg; nullopt when it cannot be read (then busy-waits stay allowed).
std::optional<unsigned> read_runnable() {
  int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[128];
  ssize_t n = ::read(fd, buf, sizeof(buf));
  ::close(fd);
  if (n <= 0) return std::nullopt;
  return BusyWaitGuard::runnable_of(std::string_view(buf, static_cast<size_t>(n)));
}

}  // namespace

const std::chrono::nanoseconds BusyWaitGuard::kPreemptedGap{[] {
  const char* v = std::getenv("PODIUM_PREEMPT_GAP_US");
  return v ? std::atoll(v) * 1000 : 250'000;
}()};

BusyWaitGuard& BusyWaitGuard::mine() {
  thread_local BusyWaitGuard guard;
  return guard;
}

std::optional<unsigned> BusyWaitGuard::runnable_of(std::string_view line) {
  // Fields: load1 load5 load15 runnable/total last_pid.
  size_t pos = 0;
  for (int field = 0; field < 3; ++field) {
    pos = line.find(' ', pos);
    if (pos == std::string_view::npos) return std::nullopt;
    ++pos;
  }
  size_t slash = line.find('/', pos);
  if (slash == std::string_view::npos) return std::nullopt;
  unsigned value = 0;
  auto [end, ec] = std::from_chars(line.data() + pos, line.data() + slash, value);
  if (ec != std::errc() || end != line.data() + slash) return std::nullopt;
  return value;
}

bool BusyWaitGuard::cores_to_spare(Clock::time_point now) {
  static const unsigned cores = usable_cores();
  int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  int64_t checked = g_load_checked_ns.load(std::memory_order_relaxed);
  if (checked == 0 || now_ns - checked >= std::chrono::nanoseconds(kLoadCheck).count()) {
    // One thread reads; the others go on with the last verdict.
    if (g_load_checked_ns.compare_exchange_strong(checked, now_ns, std::memory_order_relaxed)) {
      auto runnable = read_runnable();
      g_spare.store(!runnable || spare(*runnable, cores), std::memory_order_relaxed);
    }
  }
  return g_spare.load(std::memory_order_relaxed);
}

}  // namespace podium::actor
