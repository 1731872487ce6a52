#include "podium/host/child_watcher.h"

#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <asio/bind_executor.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <spdlog/spdlog.h>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace podium::host {
namespace {

constexpr size_t kMaxLine = 64 * 1024;  // longer lines are delivered in pieces of this size
constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kPumpBudget = 1 << 20;  // bytes read per wakeup before yielding the thread

bool kernel_has_pidfd() {
  static const bool has = [] {
    const int fd = static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0));
    if (fd >= 0) close(fd);
    return fd >= 0 || errno != ENOSYS;
  }();
  return has;
}

struct Pipe {
  Pipe(asio::io_context& io, Stream s) : stream(s), sd(io) {}
  const Stream stream;
  asio::posix::stream_descriptor sd;
  std::string pending;  // bytes of an unfinished line
};

// One spawned process. The descriptors and line buffers are touched only by handlers on
// `strand`, or by stop() once no handler can run.
struct Child {
  Child(asio::io_context& io, pid_t p, bool group, OnExit exit, OnOutputLine output)
      : pid(p),
        own_group(group),
        on_exit(std::move(exit)),
        on_output(std::move(output)),
        strand(asio::make_strand(io)),
        pidfd(io),
        out(io, Stream::kStdout),
        err(io, Stream::kStderr) {}

  const pid_t pid;
  const bool own_group;  // leads its own process group: signal the group
  const OnExit on_exit;
  const OnOutputLine on_output;
  asio::strand<asio::io_context::executor_type> strand;
  asio::posix::stream_descriptor pidfd;  // unused when watching through SIGCHLD
  Pipe out;
  Pipe err;
};

struct Termination {
  explicit Termination(asio::io_context& io) : timer(io) {}
  asio::steady_timer timer;
  std::unordered_set<pid_t> waiting;  // guarded by Impl::mu_
  std::function<void()> done;
};

// Signals the child's whole tree where it has its own group. The caller holds Impl::mu_ or
// owns a child that no handler can reap, so the pid is not recycled (HO-4).
void signal_tree(const Child& c, int sig) { ::kill(c.own_group ? -c.pid : c.pid, sig); }

void reap_blocking(pid_t pid) {
  siginfo_t info;
  while (waitid(P_PID, pid, &info, WEXITED) < 0 && errno == EINTR) {
  }
}

// The io handler of watcher X that runs on this thread, if any (see Gate).
thread_local const void* t_handler_of = nullptr;

}  // namespace

class ChildWatcher::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(asio::io_context& io, bool use_pidfd) : io_(io), use_pidfd_(use_pidfd) {}

  Result<pid_t> spawn(const ChildSpec& spec, OnExit on_exit, OnOutputLine on_output);
  Status signal(pid_t pid, int sig, bool group);
  void kill_all(int sig);
  void terminate_all(std::chrono::milliseconds grace, std::function<void()> done);
  size_t alive() const;
  void stop();

 private:
  // Admits an io handler unless the watcher is stopped. stop() waits until no handler is
  // inside a Gate, except the one it is called from.
  class Gate {
   public:
    explicit Gate(Impl& impl) : impl_(impl) {
      std::lock_guard lock(impl_.mu_);
      open_ = !impl_.stopped_;
      if (!open_) return;
      ++impl_.active_;
      prev_ = std::exchange(t_handler_of, &impl_);
    }
    ~Gate() {
      if (!open_) return;
      t_handler_of = prev_;
      std::lock_guard lock(impl_.mu_);
      --impl_.active_;
      if (impl_.stopped_) impl_.idle_.notify_all();
    }
    explicit operator bool() const { return open_; }

   private:
    Impl& impl_;
    bool open_ = false;
    const void* prev_ = nullptr;
  };

  enum class Reap { kRunning, kExited, kLost };

  Status attach(Child& c, SpawnedProcess& proc);
  Reap reap_locked(Child& c, ExitStatus& status);
  void wait_exit(std::shared_ptr<Child> c);
  void wait_sigchld();
  void reap_exited();
  void wait_output(std::shared_ptr<Child> c, Pipe& p);
  bool pump(Child& c, Pipe& p, size_t budget);
  void drain(Child& c, Pipe& p);
  void emit_lines(Child& c, Pipe& p, bool flush);
  void finish(Child& c, const ExitStatus* status);
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }

  asio::io_context& io_;
  const bool use_pidfd_;
  mutable std::mutex mu_;
  std::condition_variable idle_;  // notified when a handler leaves its Gate after stop()
  // Guarded by mu_ (stopped_ is written under mu_, and read without it to skip callbacks):
  std::unordered_map<pid_t, std::shared_ptr<Child>> children_;  // spawned, not yet reaped
  std::vector<std::shared_ptr<Termination>> terminations_;
  std::optional<asio::signal_set> sigchld_;  // SIGCHLD mode, created by the first spawn
  std::atomic<bool> stopped_ = false;
  int active_ = 0;  // handlers inside a Gate
};

Result<pid_t> ChildWatcher::Impl::spawn(const ChildSpec& spec, OnExit on_exit,
                                        OnOutputLine on_output) {
  if (spec.capture_output && !on_output) {
    return std::unexpected(make_error(
        HostErrc::kInvalidSpec, "spawn " + spec.path + ": capture_output without a callback"));
  }
  const auto stopped_error = [&spec] {
    return std::unexpected(make_error(HostErrc::kStopped, "spawn " + spec.path + ": stopped"));
  };
  {
    std::lock_guard lock(mu_);
    if (stopped_) return stopped_error();
    if (!use_pidfd_ && !sigchld_) {
      std::error_code ec;
      sigchld_.emplace(io_).add(SIGCHLD, ec);
      if (ec) {
        sigchld_.reset();
        return std::unexpected(make_error(HostErrc::kSpawnFailed,
                                          "watch SIGCHLD: " + ec.message()));
      }
      wait_sigchld();
    }
  }
  auto proc = spawn_process(spec);
  if (!proc) return std::unexpected(std::move(proc.error()));
  auto child = std::make_shared<Child>(io_, proc->pid,
                                       spec.new_process_group || spec.new_session,
                                       std::move(on_exit),
                                       std::move(on_output));
  Status attached = attach(*child, *proc);
  bool watched = false;
  {
    std::lock_guard lock(mu_);
    if (attached && !stopped_) {
      children_.emplace(child->pid, child);
      if (use_pidfd_) wait_exit(child);
      if (child->out.sd.is_open()) wait_output(child, child->out);
      if (child->err.sd.is_open()) wait_output(child, child->err);
      watched = true;
    }
  }
  // Once watched, the child may be reaped at any moment: do not touch it here.
  if (!watched) {
    signal_tree(*child, SIGKILL);
    reap_blocking(child->pid);
    if (!attached) return std::unexpected(std::move(attached.error()));
    return stopped_error();
  }
  if (!use_pidfd_) {
    // The child may have exited, and its SIGCHLD been handled, before it was in children_.
    asio::post(io_, [self = shared_from_this()] {
      if (Gate gate(*self); gate) self->reap_exited();
    });
  }
  return child->pid;
}

Status ChildWatcher::Impl::attach(Child& c, SpawnedProcess& proc) {
  const auto adopt = [](asio::posix::stream_descriptor& sd, UniqueFd& fd) {
    std::error_code ec;
    sd.assign(fd.get(), ec);
    if (!ec) (void)fd.release();
    return ec;
  };
  std::error_code ec;
  if (use_pidfd_) {
    UniqueFd pidfd(static_cast<int>(syscall(SYS_pidfd_open, c.pid, 0)));
    ec = pidfd ? adopt(c.pidfd, pidfd) : std::error_code(errno, std::system_category());
  }
  if (!ec && proc.out) ec = adopt(c.out.sd, proc.out);
  if (!ec && proc.out) c.out.sd.non_blocking(true, ec);
  if (!ec && proc.err) ec = adopt(c.err.sd, proc.err);
  if (!ec && proc.err) c.err.sd.non_blocking(true, ec);
  if (!ec) return ok();
  return std::unexpected(make_error(
      HostErrc::kSpawnFailed, "watch child " + std::to_string(c.pid) + ": " + ec.message()));
}

// Reaps `c` if it has exited and forgets it; holding mu_ keeps signal() off reaped pids.
ChildWatcher::Impl::Reap ChildWatcher::Impl::reap_locked(Child& c, ExitStatus& status) {
  siginfo_t info = {};
  int r;
  while ((r = waitid(P_PID, c.pid, &info, WEXITED | WNOHANG)) < 0 && errno == EINTR) {
  }
  if (r == 0 && info.si_pid == 0) return Reap::kRunning;
  const int err = errno;
  children_.erase(c.pid);
  if (r < 0) {
    spdlog::error("host: child {} was reaped behind the watcher's back ({}); exit status lost",
                  c.pid, strerror(err));
    return Reap::kLost;
  }
  status = ExitStatus::from_siginfo(info);
  return Reap::kExited;
}

void ChildWatcher::Impl::wait_exit(std::shared_ptr<Child> c) {
  Child& child = *c;
  child.pidfd.async_wait(
      asio::posix::stream_descriptor::wait_read,
      asio::bind_executor(child.strand, [self = shared_from_this(),
                                         c = std::move(c)](std::error_code ec) {
        Gate gate(*self);
        if (!gate || ec) return;
        ExitStatus status;
        Reap reap;
        {
          std::lock_guard lock(self->mu_);
          reap = self->reap_locked(*c, status);
        }
        if (reap == Reap::kRunning) return self->wait_exit(c);  // a readable pidfd says exited
        self->finish(*c, reap == Reap::kExited ? &status : nullptr);
      }));
}

void ChildWatcher::Impl::wait_sigchld() {
  sigchld_->async_wait([self = shared_from_this()](std::error_code ec, int) {
    Gate gate(*self);
    if (!gate || ec) return;
    self->reap_exited();
    self->wait_sigchld();
  });
}

// SIGCHLD mode: signals coalesce, so every child is checked.
void ChildWatcher::Impl::reap_exited() {
  std::vector<std::pair<std::shared_ptr<Child>, std::optional<ExitStatus>>> gone;
  {
    std::lock_guard lock(mu_);
    std::vector<std::shared_ptr<Child>> all;
    for (const auto& [pid, c] : children_) all.push_back(c);
    for (auto& c : all) {
      ExitStatus status;
      const Reap reap = reap_locked(*c, status);
      if (reap == Reap::kExited) gone.emplace_back(std::move(c), status);
      if (reap == Reap::kLost) gone.emplace_back(std::move(c), std::nullopt);
    }
  }
  for (auto& [c, status] : gone) {
    Child& child = *c;
    asio::post(child.strand, [self = shared_from_this(), c = std::move(c), status] {
      if (Gate gate(*self); gate) self->finish(*c, status ? &*status : nullptr);
    });
  }
}

void ChildWatcher::Impl::wait_output(std::shared_ptr<Child> c, Pipe& p) {
  Child& child = *c;
  p.sd.async_wait(asio::posix::stream_descriptor::wait_read,
                  asio::bind_executor(child.strand, [self = shared_from_this(), c = std::move(c),
                                                     &p](std::error_code ec) {
                    Gate gate(*self);
                    if (!gate || ec || !p.sd.is_open()) return;
                    if (self->pump(*c, p, kPumpBudget)) self->wait_output(c, p);
                  }));
}

// Reads about `budget` bytes at most and delivers the complete lines. At EOF flushes the
// unfinished line and closes the pipe. Returns whether the pipe is still open.
bool ChildWatcher::Impl::pump(Child& c, Pipe& p, size_t budget) {
  std::array<char, kReadChunk> buf;
  for (size_t total = 0; total < budget && !stopped();) {
    const ssize_t n = ::read(p.sd.native_handle(), buf.data(), buf.size());
    if (n > 0) {
      p.pending.append(buf.data(), static_cast<size_t>(n));
      emit_lines(c, p, false);
      total += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    if (n < 0) spdlog::warn("host: reading output of child {}: {}", c.pid, strerror(errno));
    emit_lines(c, p, true);
    std::error_code ignored;
    p.sd.close(ignored);
    return false;
  }
  return !stopped();
}

// The child has exited, so the pipe holds all it wrote; a descendant that inherited the pipe
// may still write, so read only what is there now and stop capturing (HO-5).
void ChildWatcher::Impl::drain(Child& c, Pipe& p) {
  if (!p.sd.is_open()) return;
  int available = 0;
  ioctl(p.sd.native_handle(), FIONREAD, &available);
  if (!pump(c, p, static_cast<size_t>(available) + 1)) return;
  emit_lines(c, p, true);
  std::error_code ignored;
  p.sd.close(ignored);
}

void ChildWatcher::Impl::emit_lines(Child& c, Pipe& p, bool flush) {
  std::string_view rest(p.pending);
  const auto deliver = [&](size_t len, size_t skip) {
    if (!stopped()) c.on_output(c.pid, p.stream, rest.substr(0, len));
    rest.remove_prefix(len + skip);
  };
  for (;;) {
    const size_t nl = rest.find('\n');
    const size_t len = nl == std::string_view::npos ? rest.size() : nl;
    if (len > kMaxLine) {
      deliver(kMaxLine, 0);
    } else if (nl != std::string_view::npos) {
      deliver(nl, 1);
    } else {
      break;
    }
  }
  if (flush && !rest.empty()) deliver(rest.size(), 0);
  p.pending.erase(0, p.pending.size() - rest.size());
}

// Runs on the child's strand once it is reaped: its output first, then its exit (HO-5, HO-1).
void ChildWatcher::Impl::finish(Child& c, const ExitStatus* status) {
  drain(c, c.out);
  drain(c, c.err);
  std::error_code ignored;
  c.pidfd.close(ignored);
  if (status != nullptr && c.on_exit && !stopped()) c.on_exit(*status);
  std::vector<std::shared_ptr<Termination>> completed;
  {
    std::lock_guard lock(mu_);
    for (auto it = terminations_.begin(); it != terminations_.end();) {
      Termination& t = **it;
      if (t.waiting.erase(c.pid) == 1 && t.waiting.empty()) {
        completed.push_back(std::move(*it));
        it = terminations_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& t : completed) {
    t->timer.cancel();
    if (t->done && !stopped()) t->done();
  }
}

Status ChildWatcher::Impl::signal(pid_t pid, int sig, bool group) {
  const std::string what = (group ? "kill_group " : "kill ") + std::to_string(pid);
  std::lock_guard lock(mu_);
  const auto it = children_.find(pid);
  if (it == children_.end()) {
    return std::unexpected(make_error(HostErrc::kNoSuchChild, what + ": not a live child"));
  }
  if (group && !it->second->own_group) {
    return std::unexpected(
        make_error(HostErrc::kNoProcessGroup, what + ": the child leads no process group"));
  }
  if (::kill(group ? -pid : pid, sig) != 0) {
    return std::unexpected(make_error(HostErrc::kSignalFailed, what + ": " + strerror(errno)));
  }
  return ok();
}

void ChildWatcher::Impl::kill_all(int sig) {
  std::lock_guard lock(mu_);
  for (const auto& [pid, c] : children_) signal_tree(*c, sig);
}

void ChildWatcher::Impl::terminate_all(std::chrono::milliseconds grace,
                                       std::function<void()> done) {
  auto t = std::make_shared<Termination>(io_);
  t->done = std::move(done);
  std::lock_guard lock(mu_);
  if (stopped_) return;
  for (const auto& [pid, c] : children_) {
    signal_tree(*c, SIGTERM);
    t->waiting.insert(pid);
  }
  if (t->waiting.empty()) {
    asio::post(io_, [self = shared_from_this(), t] {
      if (Gate gate(*self); gate && t->done) t->done();
    });
    return;
  }
  terminations_.push_back(t);
  t->timer.expires_after(grace);
  t->timer.async_wait([self = shared_from_this(), t](std::error_code ec) {
    Gate gate(*self);
    if (!gate || ec) return;
    std::lock_guard lock(self->mu_);
    for (pid_t pid : t->waiting) {
      if (auto it = self->children_.find(pid); it != self->children_.end()) {
        signal_tree(*it->second, SIGKILL);
      }
    }
  });
}

size_t ChildWatcher::Impl::alive() const {
  std::lock_guard lock(mu_);
  return children_.size();
}

void ChildWatcher::Impl::stop() {
  std::unordered_map<pid_t, std::shared_ptr<Child>> children;
  std::vector<std::shared_ptr<Termination>> terminations;
  {
    std::unique_lock lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    const int own = t_handler_of == this ? 1 : 0;
    idle_.wait(lock, [&] { return active_ == own; });
    children.swap(children_);
    terminations.swap(terminations_);
  }
  // No handler runs from here on, so the children are ours alone (HO-3).
  for (const auto& [pid, c] : children) signal_tree(*c, SIGKILL);
  std::error_code ignored;
  for (const auto& [pid, c] : children) {
    reap_blocking(pid);
    c->pidfd.close(ignored);
    c->out.sd.close(ignored);
    c->err.sd.close(ignored);
  }
  for (const auto& t : terminations) t->timer.cancel();
  if (sigchld_) sigchld_->cancel(ignored);
}

ChildWatcher::ChildWatcher(asio::io_context& io, ExitWatch watch)
    : impl_(std::make_shared<Impl>(io, watch == ExitWatch::kAuto && kernel_has_pidfd())) {}

ChildWatcher::~ChildWatcher() { impl_->stop(); }

Result<pid_t> ChildWatcher::spawn(const ChildSpec& spec, OnExit on_exit,
                                  OnOutputLine on_output) {
  return impl_->spawn(spec, std::move(on_exit), std::move(on_output));
}
Status ChildWatcher::kill(pid_t pid, int sig) { return impl_->signal(pid, sig, false); }
Status ChildWatcher::kill_group(pid_t pid, int sig) { return impl_->signal(pid, sig, true); }
void ChildWatcher::kill_all(int sig) { impl_->kill_all(sig); }
void ChildWatcher::terminate_all(std::chrono::milliseconds grace, std::function<void()> done) {
  impl_->terminate_all(grace, std::move(done));
}
size_t ChildWatcher::alive() const { return impl_->alive(); }
void ChildWatcher::stop() { impl_->stop(); }

}  // namespace podium::host
