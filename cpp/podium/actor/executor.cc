#include "podium/actor/executor.h"

#include "podium/actor/busy_wait.h"

#include <spdlog/spdlog.h>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <algorithm>
#include <chrono>
#include <functional>
#include <iterator>
#include <condition_variable>
#include <cstdlib>
#include <list>
#include <mutex>
#include <thread>

namespace podium::actor {
namespace {

constexpr auto kTick = std::chrono::milliseconds(2);
// While no runner is occupied the watchdog has nothing to time, so it wakes less and less
// often (doubling up to kIdleTickMax): a proc that handles one short call every few
// milliseconds (one of hundreds sharing the cores) would otherwise pay a wake-up and two
// futex calls every kTick for nothing, more than its calls cost. A handler that starts
// running long is then seen within kIdleTickMax + kTick (AC-2).
constexpr auto kIdleTickMax = std::chrono::milliseconds(32);
// The watchdog parks when no handler has run for this long; the next handler wakes it.
constexpr auto kQuietBeforePark = std::chrono::milliseconds(100);
// A parked primary runner takes the loop back when no caller has driven it for this long.
constexpr auto kReclaimAfter = std::chrono::milliseconds(1);

// Adaptive polling. A thread that finds no work polls the reactor without blocking (an
// epoll_wait with a zero timeout) for a while before it sleeps in epoll_wait. A
// request/reply exchange then finds each side awake when the next message lands, which
// saves the scheduler's wake-up (several µs) on both ends. The window adapts per thread,
// as haltpoll does: when the event that ended a sleep came within the maximum window, a
// longer poll would have caught it, so the window grows to cover that gap; when it came
// later, polling was wasted and the window halves. An exchange at a steady pace keeps its
// polls; a proc that hears from its caller every millisecond (one of many procs sharing
// the cores) stops polling after a few messages. PODIUM_POLL_US sets the maximum (default
// 50 µs; 0 turns polling off), per process with Executor::set_poll.
int64_t initial_poll_ns() {
  if (const char* v = std::getenv("PODIUM_POLL_US")) return std::atoll(v) * 1000;
  return 50'000;
}
std::atomic<int64_t> g_poll_ns{initial_poll_ns()};
std::atomic<int64_t> g_driver_poll_ns{initial_poll_ns()};
thread_local int64_t tls_poll_window_ns = -1;  // this thread's current window; -1: unset

// Runs one handler: ready work first, then the reactor without blocking for up to this
// thread's window (at most max_poll_ns), then blocking (up to `limit` when given). Returns
// the number of handlers run (0 or 1); 0 means the io_context stopped or the limit passed.
size_t run_one_polling(asio::io_context& io, int64_t max_poll_ns,
                       std::chrono::steady_clock::duration limit =
                           std::chrono::steady_clock::duration::max()) {
  using Clock = std::chrono::steady_clock;
  // Without polling, run_one() runs ready work first too: checking with poll_one() before it
  // would cost every wake-up one more epoll_wait (the reactor runs even when nothing waits).
  if (max_poll_ns <= 0) {
    if (io.stopped()) return 0;
    return limit == Clock::duration::max() ? io.run_one() : io.run_one_for(limit);
  }
  if (size_t n = io.poll_one()) return n;
  if (io.stopped()) return 0;
  // Clock::duration::max() means no limit; it must stay max() through the subtraction below,
  // or run_one_for() computes now() + almost-max(), which overflows (UB, and in practice a
  // deadline in the past: run_one_for() returns at once and the runner spins).
  const bool unlimited = limit == Clock::duration::max();
  int64_t& window = tls_poll_window_ns;
  if (window < 0 || window > max_poll_ns) window = max_poll_ns;
  auto start = Clock::now();
  BusyWaitGuard& guard = BusyWaitGuard::mine();
  if (window > 0 && guard.may_start(start)) {  // AC-19: not while this thread loses its core
    auto poll_end =
        start + std::chrono::nanoseconds(
                    std::min<int64_t>(window, std::chrono::nanoseconds(limit).count()));
    guard.start(start);
    for (auto now = start; now < poll_end; now = Clock::now()) {
      if (!guard.check(now)) break;  // preempted while polling: sleep instead (AC-19)
      if (size_t n = io.poll_one()) return n;
      if (io.stopped()) return 0;
    }
    if (!unlimited) {
      limit -= Clock::now() - start;
      if (limit <= Clock::duration::zero()) return 0;
    }
  }
  size_t n = unlimited ? io.run_one() : io.run_one_for(limit);
  if (n > 0 && max_poll_ns > 0) {
    int64_t gap = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
    if (gap <= max_poll_ns) {
      window = std::min(max_poll_ns, std::max(window * 2, gap + gap / 4 + 2'000));
    } else {
      window /= 2;
    }
  }
  return n;
}

struct Runner {
  // Odd while the runner is inside an actor handler; bumped at begin and end.
  std::atomic<uint64_t> handler_seq{0};
  std::atomic<bool> blocked{false};
  std::atomic<bool> parked{false};  // the primary, stepped aside for a driving caller
  std::atomic<bool> finished{false};
  uint64_t seen_seq = 0;  // watchdog-thread only
  std::thread thread;
};

thread_local Executor* tls_executor = nullptr;
thread_local Runner* tls_runner = nullptr;

}  // namespace

struct Executor::Impl {
  Executor* self;
  asio::io_context& io;
  size_t max_runners;
  asio::executor_work_guard<asio::io_context::executor_type> work;

  std::mutex mu;                 // guards runners, stopping, watchdog_parked wake-ups
  std::list<Runner> runners;     // guarded by mu; stable addresses
  // The runner that called stop() from inside one of its handlers: it cannot join itself, and
  // it still runs (its loop returns into runner_main, which writes to its Runner), so its
  // node stays alive here until ~Executor joins it (AC-3). At most one.
  std::list<Runner> stopped_from_inside;
  std::atomic<size_t> live{0};   // runners not yet finished
  bool stopping = false;         // guarded by mu
  std::condition_variable watchdog_cv;
  std::atomic<bool> watchdog_parked{false};
  std::thread watchdog;

  // Caller driving (drive()): who runs the loop besides the escalation runners.
  enum class Loop : uint8_t { kRunner, kParkRequested, kParked, kDriven };
  std::mutex drive_mu;                  // guards loop, last_release, drive_stopping
  std::condition_variable drive_cv;
  std::atomic<Loop> loop{Loop::kRunner};  // written under drive_mu, read anywhere
  std::chrono::steady_clock::time_point last_release;
  bool drive_stopping = false;
  // on_release() waiters, oldest first: (token, wake). The first is woken at each release.
  std::list<std::pair<uint64_t, std::function<void()>>> release_waiters;
  uint64_t next_release_token = 1;
  bool reclaim_now = false;             // hand_back(): the primary takes the loop back at once
  // A caller asked the primary to park and has not yet taken the loop (or given up): the
  // primary must not reclaim it meanwhile, however late that caller is scheduled.
  bool handover_pending = false;
  // AC-22: the parked primary sleeps until a caller's release (or giving up) wakes it.
  bool primary_awaits_release = false;
  Runner* primary = nullptr;            // set once by start(), before its thread; never retires
  Runner driver_slot;                   // the driving caller's runner slot (one at a time)

  Impl(Executor* s, asio::io_context& i, size_t max)
      : self(s), io(i), max_runners(max), work(asio::make_work_guard(i)) {}

  static bool occupied(const Runner& r) {
    return (r.handler_seq.load(std::memory_order_relaxed) & 1) != 0 ||
           r.blocked.load(std::memory_order_relaxed);
  }

  bool driving() const { return loop.load(std::memory_order_relaxed) == Loop::kDriven; }

  // Requires mu. Joins runners that retired, then starts a new one.
  // as_primary: start()'s first runner; `primary` is set before its thread starts, which
  // reads it unlocked (thread creation orders the write before those reads).
  void add_runner_locked(bool as_primary = false) {
    for (auto it = runners.begin(); it != runners.end();) {
      if (it->finished.load(std::memory_order_acquire)) {
        it->thread.join();
        it = runners.erase(it);
      } else {
        ++it;
      }
    }
    if (stopping || live.load() >= max_runners) return;
    Runner& r = runners.emplace_back();
    live.fetch_add(1);
    if (as_primary) primary = &r;
    r.thread = std::thread(&Impl::runner_main, this, &r);
  }

  // True when a runner other than `me` is free to run new work. A driving caller counts
  // (it is in the loop until its wait ends); a parked primary does not (it is `blocked`).
  bool someone_free_locked(const Runner* me) {
    bool drive = driving();
    for (auto& r : runners) {
      if (&r == me || r.finished.load(std::memory_order_relaxed) || occupied(r)) continue;
      // A parked primary comes back within kReclaimAfter unless a caller drives.
      if (r.parked.load(std::memory_order_relaxed) && drive) continue;
      return true;
    }
    return drive && &driver_slot != me && !occupied(driver_slot);
  }

  // The primary runner steps aside while callers drive the loop, and takes it back once no
  // caller has driven it for kReclaimAfter. False when the executor stops.
  bool park_if_requested(Runner* me) {
    std::unique_lock l(drive_mu);
    if (loop == Loop::kRunner) return !drive_stopping;
    if (loop == Loop::kParkRequested) {
      loop = Loop::kParked;
      last_release = std::chrono::steady_clock::now();
      drive_cv.notify_all();
      // The thread that asked may have left without driving (its wait ended meanwhile):
      // the loop is free, so the oldest on_release() waiter looks again too.
      if (!release_waiters.empty()) {
        auto wake = std::move(release_waiters.front().second);
        release_waiters.pop_front();
        l.unlock();
        wake();
        l.lock();
      }
    }
    me->parked.store(true, std::memory_order_relaxed);
    while (!drive_stopping) {
      if (loop == Loop::kParked && !handover_pending &&
          (reclaim_now || std::chrono::steady_clock::now() - last_release >= kReclaimAfter)) {
        loop = Loop::kRunner;
        reclaim_now = false;
        break;
      }
      if (loop == Loop::kDriven || handover_pending) {
        // A caller holds the loop (a proc's main thread, all the while it serves) or is
        // taking it: its release or its giving up wakes this thread (drive()), so a parked
        // runner makes no timed wake-ups however long a caller drives. Only a release that
        // finds it so waiting wakes it: a caller that drives call after call wakes it at
        // most once per kReclaimAfter, not once per call.
        primary_awaits_release = true;
        drive_cv.wait(l);
        primary_awaits_release = false;
      } else {
        drive_cv.wait_until(l, last_release + kReclaimAfter);
      }
    }
    me->parked.store(false, std::memory_order_relaxed);
    return !drive_stopping;
  }

  bool should_retire(Runner* me) {
    if (live.load(std::memory_order_relaxed) <= 1) return false;
    std::lock_guard lock(mu);
    if (stopping) return false;  // io.stop() ends run_one() anyway
    // Stay while I am the only free runner; go when another one is free.
    if (!someone_free_locked(me)) return false;
    me->finished.store(true, std::memory_order_release);
    live.fetch_sub(1);
    return true;
  }

  void runner_main(Runner* me) {
    tls_executor = self;
    tls_runner = me;
    while (!io.stopped()) {
      if (me == primary && !park_if_requested(me)) break;
      if (run_one_polling(io, g_poll_ns.load(std::memory_order_relaxed)) == 0 && io.stopped()) break;
      if (me != primary && should_retire(me)) return;
    }
    me->finished.store(true, std::memory_order_release);
    live.fetch_sub(1);
  }

  void watchdog_main() {
    using Clock = std::chrono::steady_clock;
    auto last_activity = Clock::now();
    std::chrono::milliseconds interval = kTick;
    std::unique_lock lock(mu);
    while (!stopping) {
      if (Clock::now() - last_activity >= kQuietBeforePark) {
        watchdog_parked.store(true, std::memory_order_release);
        watchdog_cv.wait(lock, [&] { return stopping || !watchdog_parked.load(); });
        last_activity = Clock::now();
        interval = kTick;
        continue;
      }
      watchdog_cv.wait_for(lock, interval, [&] { return stopping; });
      if (stopping) break;
      bool any_activity = false;
      bool any_occupied = false;
      bool all_stuck = true;
      bool any_live = false;
      bool drive = driving();
      auto check = [&](Runner& r) {
        uint64_t seq = r.handler_seq.load(std::memory_order_relaxed);
        bool in_handler = (seq & 1) != 0;
        bool stuck = (in_handler && seq == r.seen_seq) || r.blocked.load();
        // A parked primary stands in for the driving caller, which is checked itself.
        if (r.parked.load(std::memory_order_relaxed)) stuck = drive;
        if (seq != r.seen_seq || in_handler) any_activity = true;
        if (in_handler || r.blocked.load(std::memory_order_relaxed)) any_occupied = true;
        r.seen_seq = seq;
        if (!stuck) all_stuck = false;
      };
      for (auto& r : runners) {
        if (r.finished.load(std::memory_order_relaxed)) continue;
        any_live = true;
        check(r);
      }
      if (drive) check(driver_slot);
      if (any_live && all_stuck) add_runner_locked();
      if (any_activity) last_activity = Clock::now();
      interval = any_occupied ? kTick : std::min(interval * 2, kIdleTickMax);
    }
  }
};

Executor::Executor(asio::io_context& io, size_t max_runners)
    : impl_(std::make_unique<Impl>(this, io, max_runners)) {}

Executor::~Executor() {
  stop();
  if (impl_->stopped_from_inside.empty()) return;
  std::thread& last = impl_->stopped_from_inside.front().thread;
  if (!last.joinable()) return;
  if (last.get_id() != std::this_thread::get_id()) {
    last.join();
    return;
  }
  // Destroyed on that very runner, from inside one of its own handlers: the runner's loop
  // would return into freed memory whatever happens here, so this is a misuse; say so loudly
  // rather than std::terminate on a joinable thread.
  spdlog::critical("podium: an Executor was destroyed from inside one of its own handlers");
  std::abort();
}

void Executor::start() {
  std::lock_guard lock(impl_->mu);
  if (!impl_->runners.empty() || impl_->stopping) return;
  impl_->add_runner_locked(/*as_primary=*/true);
  impl_->watchdog = std::thread(&Impl::watchdog_main, impl_.get());
}

void Executor::stop() {
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->stopping) return;
    impl_->stopping = true;
    impl_->watchdog_parked.store(false);
  }
  impl_->watchdog_cv.notify_all();
  std::list<std::pair<uint64_t, std::function<void()>>> waiters;
  {
    std::lock_guard lock(impl_->drive_mu);
    impl_->drive_stopping = true;
    waiters.swap(impl_->release_waiters);
  }
  impl_->drive_cv.notify_all();
  for (auto& w : waiters) w.second();  // they look again, and find the executor stopping
  impl_->work.reset();
  impl_->io.stop();
  if (impl_->watchdog.joinable()) impl_->watchdog.join();
  std::list<Runner> runners;
  {
    std::lock_guard lock(impl_->mu);
    runners.swap(impl_->runners);
  }
  for (auto it = runners.begin(); it != runners.end();) {
    auto next = std::next(it);
    if (it->thread.get_id() == std::this_thread::get_id()) {
      // This thread is that runner: keep its Runner alive, joined by ~Executor.
      impl_->stopped_from_inside.splice(impl_->stopped_from_inside.end(), runners, it);
    } else if (it->thread.joinable()) {
      it->thread.join();
    }
    it = next;
  }
}

Executor* Executor::current() { return tls_executor; }

bool Executor::drive(const std::function<bool()>& done,
                     std::chrono::steady_clock::time_point deadline) {
  if (tls_runner) return false;  // runners run the loop already
  Impl& im = *impl_;
  {
    std::unique_lock l(im.drive_mu);
    if (im.drive_stopping || im.primary == nullptr || im.reclaim_now) return false;
    auto state = im.loop.load();
    if (state == Impl::Loop::kDriven) return false;  // another caller drives for everyone
    // Giving up a requested handover: the primary reclaims kReclaimAfter from now.
    auto give_up = [&] {
      im.handover_pending = false;
      im.last_release = std::chrono::steady_clock::now();
      if (im.primary_awaits_release) im.drive_cv.notify_all();
    };
    if (state == Impl::Loop::kRunner) {
      im.loop = Impl::Loop::kParkRequested;
      im.handover_pending = true;
      l.unlock();
      asio::post(im.io, [] {});  // ends the primary's run_one() so that it parks
      l.lock();
      while (im.loop.load() == Impl::Loop::kParkRequested && !im.drive_stopping) {
        if (done()) {  // answered while the primary was handing over
          give_up();
          return true;
        }
        if (std::chrono::steady_clock::now() >= deadline) {
          give_up();
          return false;
        }
        im.drive_cv.wait_for(l, std::chrono::microseconds(200));
      }
    }
    if (im.loop.load() != Impl::Loop::kParked || im.drive_stopping) {
      if (state == Impl::Loop::kRunner) give_up();
      return done();
    }
    im.handover_pending = false;
    im.loop = Impl::Loop::kDriven;
  }
  // This thread is the loop's runner until done() or the deadline.
  Executor* outer_executor = tls_executor;
  Runner* outer_runner = tls_runner;
  tls_executor = this;
  tls_runner = &im.driver_slot;
  while (!done() && !im.io.stopped()) {
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    run_one_polling(im.io, g_driver_poll_ns.load(std::memory_order_relaxed), std::min<std::chrono::steady_clock::duration>(
                               deadline - now, std::chrono::seconds(1)));
  }
  // AC-21: what the handler that completed the wait left queued (the work of messages read
  // before the reply, in the same batch) runs before the caller goes on.
  for (int i = 0; i < kDrainAfterDone && !im.io.stopped() && im.io.poll_one() > 0; ++i) {
  }
  tls_executor = outer_executor;
  tls_runner = outer_runner;
  std::function<void()> wake;
  {
    std::lock_guard l(im.drive_mu);
    im.loop = Impl::Loop::kParked;
    im.last_release = std::chrono::steady_clock::now();
    if (!im.release_waiters.empty()) {  // the oldest waiter takes the loop over
      wake = std::move(im.release_waiters.front().second);
      im.release_waiters.pop_front();
    }
    // AC-22: the parked primary, where it sleeps until a release (it reclaims the loop
    // kReclaimAfter from now).
    if (im.primary_awaits_release) im.drive_cv.notify_all();
  }
  if (wake) wake();
  return done();
}

uint64_t Executor::on_release(std::function<void()> wake) {
  Impl& im = *impl_;
  std::lock_guard l(im.drive_mu);
  if (im.drive_stopping) return 0;
  // Free to take: parked (and not promised to the primary) or run by the primary, which
  // steps aside when asked. Driven, or handed back: wait.
  auto state = im.loop.load();
  if (!im.reclaim_now && (state == Impl::Loop::kParked || state == Impl::Loop::kRunner)) return 0;
  uint64_t token = im.next_release_token++;
  im.release_waiters.emplace_back(token, std::move(wake));
  return token;
}

void Executor::cancel_release(uint64_t token) {
  Impl& im = *impl_;
  std::lock_guard l(im.drive_mu);
  im.release_waiters.remove_if([token](const auto& w) { return w.first == token; });
}

void Executor::hand_back() {
  Impl& im = *impl_;
  {
    std::lock_guard l(im.drive_mu);
    if (im.loop.load() != Impl::Loop::kParked) return;
    im.reclaim_now = true;
  }
  im.drive_cv.notify_all();
}

namespace {
std::atomic<Executor*> g_drivable{nullptr};
}

void Executor::set_poll(std::chrono::nanoseconds runners, std::chrono::nanoseconds drivers) {
  g_poll_ns.store(runners.count(), std::memory_order_relaxed);
  g_driver_poll_ns.store(drivers.count(), std::memory_order_relaxed);
}

void Executor::set_drivable(Executor* executor) { g_drivable.store(executor); }
Executor* Executor::drivable() { return g_drivable.load(std::memory_order_acquire); }

void Executor::handler_begin() {
  if (tls_runner) tls_runner->handler_seq.fetch_add(1, std::memory_order_relaxed);
  if (impl_->watchdog_parked.load(std::memory_order_relaxed)) {
    {
      std::lock_guard lock(impl_->mu);
      impl_->watchdog_parked.store(false);
    }
    impl_->watchdog_cv.notify_one();
  }
}

void Executor::handler_end() {
  if (tls_runner) tls_runner->handler_seq.fetch_add(1, std::memory_order_relaxed);
}

size_t Executor::runner_count() const { return impl_->live.load(); }

BlockingScope::BlockingScope() {
  if (!tls_runner || !tls_executor) return;
  auto* impl = tls_executor->impl_.get();
  slot_ = tls_runner;
  executor_ = tls_executor;
  tls_runner->blocked.store(true, std::memory_order_relaxed);
  std::lock_guard lock(impl->mu);
  if (!impl->someone_free_locked(tls_runner)) impl->add_runner_locked();
}

BlockingScope::~BlockingScope() {
  if (slot_) static_cast<Runner*>(slot_)->blocked.store(false, std::memory_order_relaxed);
}

}  // namespace podium::actor
