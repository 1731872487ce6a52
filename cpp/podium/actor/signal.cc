#include "podium/actor/signal.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "podium/actor/busy_wait.h"
#include "podium/actor/executor.h"
#include "podium/actor/proc.h"

namespace podium::actor {
namespace {

// How long a waiter spins before it sleeps; PODIUM_SPIN_US overrides the default.
int64_t initial_spin_ns() {
  if (const char* v = std::getenv("PODIUM_SPIN_US")) return std::atoll(v) * 1000;
  return 200'000;
}
std::atomic<int64_t> g_spin_ns{initial_spin_ns()};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op | FUTEX_PRIVATE_FLAG, val,
                 timeout, nullptr, 0);
}

}  // namespace

void Signal::set_spin(std::chrono::nanoseconds spin) {
  g_spin_ns.store(spin.count(), std::memory_order_relaxed);
}

void Signal::set() {
  if (state_.exchange(kSet, std::memory_order_acq_rel) == kSleeping) {
    futex(&state_, FUTEX_WAKE, INT32_MAX, nullptr);
  }
}

bool Signal::spin_until_set(std::chrono::steady_clock::time_point deadline) const {
  auto now = std::chrono::steady_clock::now();
  BusyWaitGuard& guard = BusyWaitGuard::mine();
  if (!guard.may_start(now)) return is_set();  // AC-19: this thread loses its core; sleep
  guard.start(now);
  auto spin_end = now + std::chrono::nanoseconds(g_spin_ns.load(std::memory_order_relaxed));
  spin_end = std::min(spin_end, deadline);
  uint32_t n = 0;
  while (true) {
    if (is_set()) return true;
    cpu_relax();
    // Reading the clock costs ~20 ns; check it every 64 spins. No sched_yield(): with another
    // runnable thread on this core it gives the core away for a whole time slice (ms).
    if ((++n & 63) == 0) {
      now = std::chrono::steady_clock::now();
      if (now >= spin_end || !guard.check(now)) return is_set();
    }
  }
}

void Signal::wait() {
  if (is_set()) return;
  // An untimed wait may run the local handler it waits for (it cannot overrun a timeout),
  // then read its own reply by running the loop itself.
  help_while_waiting();
  if (is_set()) return;
  if (Executor* ex = Executor::drivable()) {
    if (ex->drive([this] { return is_set(); }, std::chrono::steady_clock::time_point::max())) {
      return;
    }
  }
  // A century is "forever" and keeps one code path.
  wait_for(std::chrono::hours(24 * 365 * 100));
}

bool Signal::wait_slice(std::chrono::nanoseconds timeout) {
  if (is_set()) return true;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  help_while_waiting();
  if (is_set()) return true;
  if (Executor* ex = Executor::drivable()) {
    if (ex->drive([this] { return is_set(); }, deadline)) return true;
  }
  auto left = deadline - std::chrono::steady_clock::now();
  if (left <= std::chrono::steady_clock::duration::zero()) return is_set();
  return wait_for(left);
}

bool Signal::wait_for(std::chrono::nanoseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  // A runner thread that blocks hands its I/O duty to another runner first, so that the
  // reply it waits for can still be read (AC-2 relies on progress elsewhere).
  if (is_set()) return true;
  BlockingScope blocking;
  if (spin_until_set(deadline)) return true;
  while (true) {
    uint32_t s = state_.load(std::memory_order_acquire);
    if (s == kSet) return true;
    if (s == kUnset &&
        !state_.compare_exchange_weak(s, kSleeping, std::memory_order_acq_rel)) {
      continue;
    }
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return is_set();
    auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
    timespec ts{static_cast<time_t>(left / 1'000'000'000), static_cast<long>(left % 1'000'000'000)};
    futex(&state_, FUTEX_WAIT, kSleeping, &ts);
  }
}

}  // namespace podium::actor
