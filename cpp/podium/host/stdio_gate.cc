#include "podium/host/stdio_gate.h"

#include <pthread.h>

#include <new>

#include "podium/base/write_all.h"

namespace podium::host {

StdioGate& StdioGate::instance() {
  static StdioGate* gate = [] {
    auto* g = new StdioGate();  // never destroyed: its thread may wait at exit
    // A process that forks (a DataLoader's workers, multiprocessing) must not leave its child
    // a lock that a pump thread held: fork() takes it first; the child, whose only thread
    // this is, starts from an empty gate without the timer thread it did not inherit.
    ::pthread_atfork([] { instance_unsafe()->mu_.lock(); },
                     [] { instance_unsafe()->mu_.unlock(); },
                     [] { instance_unsafe()->reset_in_child(); });
    return g;
  }();
  return *gate;
}

StdioGate* StdioGate::instance_unsafe() { return &instance(); }

void StdioGate::reset_in_child() {
  mu_.unlock();  // locked by this thread in the prepare handler
  new (&cv_) std::condition_variable();  // waited on by a thread the child does not have
  for (Fd& f : fds_) f = Fd{};
  timer_started_ = false;
}

void StdioGate::write_lines(int fd, std::string_view data) {
  write_lines(fd, data, [](int f, std::string_view d) { (void)write_all(f, d); });
}

void StdioGate::write_lines(int fd, std::string_view data, const Writer& writer) {
  std::unique_lock lock(mu_);
  Fd* f = slot(fds_, fd);
  if (f == nullptr) {
    writer(fd, data);
    return;
  }
  const bool overdue = std::chrono::steady_clock::now() - f->since >= hold_;
  if (!f->open || overdue) {
    release_locked(fd);  // lines held before these go first (SG-2)
    writer(fd, data);
    return;
  }
  const bool was_empty = f->held.empty();
  f->held.append(data);
  if (!timer_started_) {
    timer_started_ = true;
    std::thread([this] { run_timer(); }).detach();
  }
  if (was_empty) cv_.notify_one();
}

void StdioGate::mark(int fd, bool open) {
  std::unique_lock lock(mu_);
  mark_locked(fd, open);
}

bool StdioGate::try_mark(int fd, bool open) {
  std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  Fd* f = slot(fds_, fd);
  if (f != nullptr && !open && !f->held.empty()) return false;  // a write: not with the GIL
  mark_locked(fd, open);
  return true;
}

void StdioGate::mark_locked(int fd, bool open) {
  Fd* f = slot(fds_, fd);
  if (f == nullptr) return;
  if (open && !f->open) f->since = std::chrono::steady_clock::now();
  f->open = open;
  if (!open) release_locked(fd);
}

void StdioGate::set_hold(std::chrono::milliseconds hold) {
  std::lock_guard lock(mu_);
  hold_ = hold;
  cv_.notify_one();
}

std::chrono::milliseconds StdioGate::hold() const {
  std::lock_guard lock(mu_);
  return hold_;
}

void StdioGate::release_locked(int fd) {
  Fd* f = slot(fds_, fd);
  if (f == nullptr || f->held.empty()) return;
  std::string text;
  text.swap(f->held);
  (void)write_all(fd, text);
}

void StdioGate::run_timer() {
  std::unique_lock lock(mu_);
  for (;;) {
    auto next = std::chrono::steady_clock::time_point::max();
    const auto now = std::chrono::steady_clock::now();
    for (int fd = 1; fd <= 2; ++fd) {
      Fd& f = fds_[fd - 1];
      if (f.held.empty()) continue;
      const auto due = f.since + hold_;
      if (!f.open || due <= now) {
        release_locked(fd);
      } else if (due < next) {
        next = due;
      }
    }
    if (next == std::chrono::steady_clock::time_point::max()) {
      cv_.wait(lock);
    } else {
      cv_.wait_until(lock, next);
    }
  }
}

}  // namespace podium::host
