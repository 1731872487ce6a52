#include "podium/host/zygote.h"

#include <msgpack.hpp>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <mutex>
#include <algorithm>
#include <optional>
#include <unordered_map>

#include "podium/host/error.h"

extern char** environ;

namespace podium::host {
namespace {

constexpr size_t kMaxPacket = 1 << 20;  // a request carries a whole environment

template <class... T>
std::string pack(const T&... fields) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(sizeof...(T));
  (pk.pack(fields), ...);
  return std::string(buf.data(), buf.size());
}

bool send_packet(int fd, const std::string& p) {
  while (true) {
    ssize_t n = ::send(fd, p.data(), p.size(), MSG_NOSIGNAL);
    if (n >= 0) return static_cast<size_t>(n) == p.size();
    if (errno != EINTR) return false;
  }
}

constexpr size_t kMaxFds = 8;  // descriptors per request

// One packet, with `fds` as SCM_RIGHTS when there are any.
bool send_packet_fds(int fd, const std::string& p, const std::vector<int>& fds) {
  if (fds.empty()) return send_packet(fd, p);
  iovec iov{const_cast<char*>(p.data()), p.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  while (true) {
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n >= 0) return static_cast<size_t>(n) == p.size();
    if (errno != EINTR) return false;
  }
}

// In a forked child: each received descriptor onto its target. Every source is first copied
// above the highest target, so no dup2 overwrites a source still to be moved (ZY-5).
bool apply_fds(const std::vector<int>& fds, const std::vector<int>& targets) {
  int top = 2;
  for (int t : targets) top = std::max(top, t);
  std::vector<int> high;
  for (int fd : fds) {
    int h = ::fcntl(fd, F_DUPFD_CLOEXEC, top + 1);
    if (h < 0) return false;
    high.push_back(h);
    ::close(fd);
  }
  for (size_t i = 0; i < high.size(); ++i) {
    if (::dup2(high[i], targets[i]) < 0) return false;  // dup2 clears close-on-exec
    ::close(high[i]);
  }
  return true;
}

void report_exits(int fd) {
  while (true) {
    siginfo_t info{};
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG) != 0 || info.si_pid == 0) return;
    ExitStatus s = ExitStatus::from_siginfo(info);
    if (!send_packet(fd, pack(std::string("exit"), static_cast<int64_t>(s.pid), s.signaled,
                              s.code, s.core_dumped))) {
      return;
    }
  }
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1
#endif

constexpr uintptr_t kHugePage = uintptr_t{2} << 20;

bool huge_pages_wanted() {
  const char* v = std::getenv("PODIUM_ZYGOTE_HUGEPAGES");
  return v == nullptr || (std::strcmp(v, "0") != 0 && std::strcmp(v, "false") != 0);
}

}  // namespace

HugePageCollapse collapse_anonymous_memory() {
  HugePageCollapse out;
  // Read the whole map first: collapsing changes it.
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    // start-end perms offset dev inode [path]
    std::istringstream in(line);
    std::string span, perms, offset, dev, inode, path;
    in >> span >> perms >> offset >> dev >> inode;
    std::getline(in >> std::ws, path);
    if (perms.size() < 4 || perms[1] != 'w' || perms[3] != 'p') continue;  // private, writable
    if (!path.empty() && path != "[heap]") continue;  // anonymous only: no files, no stack
    auto dash = span.find('-');
    if (dash == std::string::npos) continue;
    uintptr_t a = std::strtoull(span.substr(0, dash).c_str(), nullptr, 16);
    uintptr_t b = std::strtoull(span.substr(dash + 1).c_str(), nullptr, 16);
    uintptr_t lo = (a + kHugePage - 1) & ~(kHugePage - 1);
    uintptr_t hi = b & ~(kHugePage - 1);
    if (hi > lo) ranges.emplace_back(lo, hi);
  }
  for (auto [lo, hi] : ranges) {
    for (uintptr_t c = lo; c < hi; c += kHugePage) {
      ++out.chunks;
      if (::madvise(reinterpret_cast<void*>(c), kHugePage, MADV_COLLAPSE) == 0) {
        ++out.collapsed;
        out.bytes += kHugePage;
      } else if (out.first_error == 0) {
        out.first_error = errno;  // EINVAL: no MADV_COLLAPSE, or a chunk it cannot take
      }
    }
  }
  return out;
}

Result<ZygoteChild> zygote_serve(int fd, const ForkHooks& hooks) {
  if (huge_pages_wanted()) {
    auto c = collapse_anonymous_memory();  // ZY-6
    spdlog::debug("podium zygote {}: {} of {} anonymous 2 MiB chunks in huge pages ({} MiB){}",
                  ::getpid(), c.collapsed, c.chunks, c.bytes >> 20,
                  c.first_error ? std::string(", first error: ") + std::strerror(c.first_error)
                                : std::string());
  }
  sigset_t chld, old;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  if (::sigprocmask(SIG_BLOCK, &chld, &old) != 0) {
    return std::unexpected(errno_error("zygote: sigprocmask", errno));
  }
  int sfd = ::signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) return std::unexpected(errno_error("zygote: signalfd", errno));
  const pid_t self = ::getpid();
  std::vector<char> buf(kMaxPacket);
  while (true) {
    pollfd p[2] = {{fd, POLLIN, 0}, {sfd, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return std::unexpected(errno_error("zygote: poll", errno));
    }
    if (p[1].revents & POLLIN) {
      signalfd_siginfo si;
      while (::read(sfd, &si, sizeof si) == sizeof si) {
      }
      report_exits(fd);
    }
    if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    iovec iov{buf.data(), buf.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(sfd);
      return std::unexpected(make_error(HostErrc::kStopped, "zygote: the controller has gone"));
    }
    std::vector<int> fds;  // received: closed here after the fork (ZY-5)
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const int* p = reinterpret_cast<const int*>(CMSG_DATA(c));
      fds.insert(fds.end(), p, p + count);
    }
    auto close_fds = [&fds] {
      for (int f : fds) ::close(f);
    };
    // ["spawn", id, argv, env, cwd, targets]
    uint64_t id = 0;
    ZygoteChild child;
    std::vector<int> targets;
    try {
      if (msg.msg_flags & MSG_CTRUNC) throw std::runtime_error("too many descriptors");
      auto oh = msgpack::unpack(buf.data(), static_cast<size_t>(n));
      auto arr = oh.get().as<msgpack::type::tuple<std::string, uint64_t, std::vector<std::string>,
                                                   std::vector<std::pair<std::string, std::string>>,
                                                   std::string, std::vector<int>>>();
      if (arr.get<0>() != "spawn") throw std::runtime_error("unknown request " + arr.get<0>());
      id = arr.get<1>();
      child.argv = std::move(arr.get<2>());
      child.env = std::move(arr.get<3>());
      child.cwd = std::move(arr.get<4>());
      targets = std::move(arr.get<5>());
      if (targets.size() != fds.size()) {
        throw std::runtime_error(std::to_string(targets.size()) + " targets for " +
                                 std::to_string(fds.size()) + " descriptors");
      }
    } catch (const std::exception& e) {
      close_fds();
      spdlog::error("podium zygote {}: bad request: {}", self, e.what());
      (void)send_packet(fd, pack(std::string("failed"), id, std::string("bad request: ") + e.what()));
      continue;
    }
    if (hooks.prepare) hooks.prepare();
    pid_t pid = ::fork();
    if (pid == 0) {
      if (hooks.child) hooks.child();
      ::close(fd);
      ::close(sfd);
      ::sigprocmask(SIG_SETMASK, &old, nullptr);
      if (!apply_fds(fds, targets)) {
        std::fprintf(stderr, "podium: forked proc %d: cannot set up its descriptors: %s\n",
                     ::getpid(), std::strerror(errno));
        ::_exit(127);
      }
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != self) ::_exit(127);  // the zygote died before PDEATHSIG was armed
      if (!child.cwd.empty() && ::chdir(child.cwd.c_str()) != 0) {
        std::fprintf(stderr, "podium: forked proc %d: chdir %s: %s\n", ::getpid(),
                     child.cwd.c_str(), std::strerror(errno));
        ::_exit(127);
      }
      return child;
    }
    int err = errno;
    close_fds();  // ZY-5: only the child holds them now
    // The child's process group exists before its pid is reported, whichever of the two
    // setpgid calls runs first (a kill_group right after spawn() must find it).
    if (pid > 0) ::setpgid(pid, pid);
    if (hooks.parent) hooks.parent();
    if (pid < 0) {
      (void)send_packet(fd, pack(std::string("failed"), id, std::string("fork: ") + std::strerror(err)));
    } else {
      (void)send_packet(fd, pack(std::string("spawned"), id, static_cast<int64_t>(pid)));
    }
  }
}

std::vector<std::pair<std::string, std::string>> current_environment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::pair<std::string, std::string>> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    std::string key(kv.substr(0, eq));
    bool replaced = false;
    for (const auto& o : overrides) replaced |= o.first == key;
    if (!replaced) env.emplace_back(std::move(key), std::string(kv.substr(eq + 1)));
  }
  for (const auto& o : overrides) env.push_back(o);
  return env;
}

class Zygote::Impl : public std::enable_shared_from_this<Zygote::Impl> {
 public:
  Impl(asio::io_context& io, int fd) : sd_(io, fd) {}

  void start_reading() {
    sd_.async_wait(asio::posix::stream_descriptor::wait_read,
                   [self = shared_from_this()](const std::error_code& ec) { self->on_readable(ec); });
  }

  Result<pid_t> spawn(const ZygoteChild& child, OnExit on_exit,
                      std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    if (gone_) return std::unexpected(make_error(HostErrc::kStopped, "the zygote is gone: " + why_));
    uint64_t id = next_id_++;
    pending_[id] = Pending{};
    std::vector<int> fds, targets;
    for (const auto& f : child.fds) {
      fds.push_back(f.fd);
      targets.push_back(f.target);
    }
    std::string req = pack(std::string("spawn"), id, child.argv, child.env, child.cwd, targets);
    if (req.size() > kMaxPacket || fds.size() > kMaxFds) {
      pending_.erase(id);
      return std::unexpected(make_error(HostErrc::kInvalidSpec, "zygote request too large"));
    }
    if (!send_packet_fds(sd_.native_handle(), req, fds)) {
      int err = errno;
      pending_.erase(id);
      return std::unexpected(errno_error("send to the zygote", err));
    }
    bool answered = cv_.wait_for(lock, timeout, [&] { return pending_[id].done || gone_; });
    Pending p = std::move(pending_[id]);
    pending_.erase(id);
    if (!p.done) {
      return std::unexpected(make_error(HostErrc::kSpawnFailed,
                                        answered ? "the zygote is gone: " + why_
                                                 : "the zygote did not answer within " +
                                                       std::to_string(timeout.count()) + " ms"));
    }
    if (!p.result) return std::unexpected(p.result.error());
    children_[*p.result] = std::move(on_exit);
    // An exit reported before we registered the child (it died at once) waits in early_.
    if (auto it = early_.find(*p.result); it != early_.end()) {
      ExitStatus s = it->second;
      early_.erase(it);
      auto cb = std::move(children_[s.pid]);
      children_.erase(s.pid);
      lock.unlock();
      if (cb) cb(s);
    }
    return *p.result;
  }

  Status kill_group(pid_t pid, int sig) {
    std::lock_guard lock(mu_);  // held while signalling: an exit cannot be processed meanwhile
    if (!children_.contains(pid)) {
      return std::unexpected(make_error(HostErrc::kNoSuchChild,
                                        "pid " + std::to_string(pid) + " is not a live proc of the zygote"));
    }
    if (::kill(-pid, sig) != 0) return std::unexpected(errno_error("kill", errno));
    return ok();
  }

  bool alive() {
    std::lock_guard lock(mu_);
    return !gone_;
  }

  void stop() {
    std::lock_guard lock(mu_);
    for (auto& [pid, cb] : children_) ::kill(-pid, SIGKILL);
    if (!closed_) {
      closed_ = true;
      ::shutdown(sd_.native_handle(), SHUT_WR);  // the zygote sees EOF and exits
    }
  }

  // The zygote process exited (its ChildWatcher said so) or its socket broke: ZY-2.
  void zygote_gone(std::string why) {
    std::unordered_map<pid_t, OnExit> orphans;
    {
      std::lock_guard lock(mu_);
      if (gone_) return;
      gone_ = true;
      why_ = std::move(why);
      orphans.swap(children_);
      for (auto& [pid, cb] : orphans) ::kill(-pid, SIGKILL);
    }
    cv_.notify_all();
    for (auto& [pid, cb] : orphans) {
      ExitStatus s;
      s.pid = pid;
      s.signaled = true;
      s.code = SIGKILL;
      if (cb) cb(s);
    }
  }

 private:
  struct Pending {
    bool done = false;
    Result<pid_t> result = std::unexpected(Error{});
  };

  void on_readable(const std::error_code& ec) {
    if (ec) {
      if (ec != asio::error::operation_aborted) zygote_gone("socket: " + ec.message());
      return;
    }
    char buf[512];
    while (true) {
      ssize_t n = ::recv(sd_.native_handle(), buf, sizeof buf, MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n <= 0) {
        zygote_gone(n == 0 ? "it closed its socket" : std::string("recv: ") + std::strerror(errno));
        return;
      }
      handle(buf, static_cast<size_t>(n));
    }
    start_reading();
  }

  void handle(const char* data, size_t size) {
    try {
      auto oh = msgpack::unpack(data, size);
      const auto& arr = oh.get().via.array;
      if (oh.get().type != msgpack::type::ARRAY || arr.size < 3) throw std::runtime_error("not an array");
      auto kind = arr.ptr[0].as<std::string>();
      if (kind == "exit" && arr.size == 5) {
        ExitStatus s;
        s.pid = static_cast<pid_t>(arr.ptr[1].as<int64_t>());
        s.signaled = arr.ptr[2].as<bool>();
        s.code = arr.ptr[3].as<int>();
        s.core_dumped = arr.ptr[4].as<bool>();
        OnExit cb;
        {
          std::lock_guard lock(mu_);
          auto it = children_.find(s.pid);
          if (it == children_.end()) {
            early_[s.pid] = s;  // spawn() has not registered it yet
            return;
          }
          cb = std::move(it->second);
          children_.erase(it);
        }
        if (cb) cb(s);
        return;
      }
      auto id = arr.ptr[1].as<uint64_t>();
      {
        std::lock_guard lock(mu_);
        auto it = pending_.find(id);
        if (it == pending_.end()) return;  // timed out already
        it->second.done = true;
        if (kind == "spawned") {
          it->second.result = static_cast<pid_t>(arr.ptr[2].as<int64_t>());
        } else {
          it->second.result = std::unexpected(
              make_error(HostErrc::kSpawnFailed, "zygote: " + arr.ptr[2].as<std::string>()));
        }
      }
      cv_.notify_all();
    } catch (const std::exception& e) {
      spdlog::error("podium: bad message from the zygote: {}", e.what());
    }
  }

  asio::posix::stream_descriptor sd_;
  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Pending> pending_;
  std::unordered_map<pid_t, OnExit> children_;  // forked, exit not yet reported
  std::unordered_map<pid_t, ExitStatus> early_;  // exits reported before spawn() returned
  bool gone_ = false;
  bool closed_ = false;
  std::string why_;
};

Result<std::shared_ptr<Zygote>> Zygote::start(asio::io_context& io, ChildWatcher& watcher,
                                              ChildSpec spec) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return std::unexpected(errno_error("socketpair", errno));
  }
  UniqueFd mine(sv[0]), theirs(sv[1]);
  spec.fds.push_back(PassFd{theirs.get(), 3});
  auto impl = std::make_shared<Impl>(io, mine.release());
  std::weak_ptr<Impl> weak = impl;
  auto pid = watcher.spawn(spec, [weak](const ExitStatus& s) {
    if (auto i = weak.lock()) i->zygote_gone("the zygote (pid " + std::to_string(s.pid) + ") " + s.to_string());
  });
  if (!pid) return std::unexpected(pid.error());
  impl->start_reading();
  return std::shared_ptr<Zygote>(new Zygote(std::move(impl)));
}

Zygote::Zygote(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Zygote::~Zygote() { stop(); }

Result<pid_t> Zygote::spawn(const ZygoteChild& child, OnExit on_exit,
                            std::chrono::milliseconds timeout) {
  return impl_->spawn(child, std::move(on_exit), timeout);
}
Status Zygote::kill_group(pid_t pid, int sig) { return impl_->kill_group(pid, sig); }
bool Zygote::alive() const { return impl_->alive(); }
void Zygote::stop() { impl_->stop(); }

}  // namespace podium::host
