#include "podium/host/launcher.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>

#include "podium/host/exit_status.h"
#include "podium/host/spawn.h"
#include "podium/base/unique_fd.h"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

namespace podium::host {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kTailLines = 20;
constexpr size_t kTailBytes = 64 * 1024;
constexpr size_t kMaxAddress = 4096;  // a ready line longer than this is a broken worker

// The fields of /proc/PID/stat this file needs.
struct Stat {
  char state = '?';
  pid_t pgrp = 0;
  pid_t session = 0;
  uint64_t start_time = 0;
  bool zombie() const { return state == 'Z' || state == 'X'; }
};

std::optional<Stat> read_stat(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd) return std::nullopt;
  char buf[1024];
  ssize_t n;
  while ((n = ::read(fd.get(), buf, sizeof buf - 1)) < 0 && errno == EINTR) {
  }
  if (n <= 0) return std::nullopt;
  buf[n] = '\0';
  // The command name (field 2) may hold spaces and ')': the fields start after the last ')'.
  const char* p = strrchr(buf, ')');
  if (p == nullptr) return std::nullopt;
  const char* end = buf + n;
  Stat s;
  std::vector<std::string_view> fields;  // field 3 (state) at index 0
  for (const char* q = p + 1; q < end && fields.size() < 20;) {
    while (q < end && *q == ' ') ++q;
    const char* e = q;
    while (e < end && *e != ' ' && *e != '\n') ++e;
    if (e > q) fields.emplace_back(q, static_cast<size_t>(e - q));
    q = e + 1;
  }
  if (fields.size() < 20) return std::nullopt;
  const auto num = [](std::string_view f, auto& out) {
    return std::from_chars(f.data(), f.data() + f.size(), out).ec == std::errc();
  };
  s.state = fields[0][0];
  if (!num(fields[2], s.pgrp) || !num(fields[3], s.session) || !num(fields[19], s.start_time)) {
    return std::nullopt;
  }
  return s;
}

int pidfd_open(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

bool pidfd_signal(int pidfd, int sig) {
  return syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0) == 0;
}

// Reaps the process of `pidfd` when it is an exited child of this process.
std::optional<ExitStatus> reap(int pidfd) {
  siginfo_t info = {};
  int r;
  while ((r = waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info,
                     WEXITED | WNOHANG)) < 0 &&
         errno == EINTR) {
  }
  if (r != 0 || info.si_pid == 0) return std::nullopt;
  return ExitStatus::from_siginfo(info);
}

// A live process of a session, held by a pidfd checked to be that process (WP-3).
struct Member {
  pid_t pid;
  pid_t pgrp;
  UniqueFd pidfd;
};

// The live members of session `sid`. A pid reused between the scan and pidfd_open fails the
// second read of its stat and is left out.
std::vector<Member> session_members(pid_t sid) {
  std::vector<Member> out;
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return out;
  while (const dirent* e = readdir(dir)) {
    pid_t pid = 0;
    const std::string_view name(e->d_name);
    if (std::from_chars(name.data(), name.data() + name.size(), pid).ec != std::errc() ||
        pid <= 0) {
      continue;
    }
    const auto before = read_stat(pid);
    if (!before || before->session != sid || before->zombie()) continue;
    UniqueFd fd(pidfd_open(pid));
    if (!fd) continue;  // gone already
    const auto after = read_stat(pid);
    if (!after || after->session != sid || after->zombie() ||
        after->start_time != before->start_time) {
      continue;
    }
    out.push_back({pid, after->pgrp, std::move(fd)});
  }
  closedir(dir);
  return out;
}

// Waits until one of `members` exits or `deadline` passes.
void wait_any_exit(const std::vector<Member>& members, Clock::time_point deadline) {
  std::vector<pollfd> fds;
  for (const Member& m : members) fds.push_back({m.pidfd.get(), POLLIN, 0});
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  if (left <= 0 || fds.empty()) return;
  (void)::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left, INT32_MAX)));
}

// The session of `sid`, whose leader (if it is still the worker) is `leader`.
Status end_session(pid_t sid, const UniqueFd& leader, bool leader_live, milliseconds grace) {
  if (leader_live) {
    // SIGTERM to the worker's process group: each member through its own checked pidfd.
    for (const Member& m : session_members(sid)) {
      if (m.pgrp == sid) (void)pidfd_signal(m.pidfd.get(), SIGTERM);
    }
    // The worker ends its procs on SIGTERM; those left once it has gone (and had a moment
    // to finish) are orphans and get no more of the grace period.
    auto deadline = Clock::now() + grace;
    bool orphans = false;
    for (;;) {
      if (leader) (void)reap(leader.get());
      std::vector<Member> members = session_members(sid);
      if (members.empty() || Clock::now() >= deadline) break;
      const auto is_leader = [sid](const Member& m) { return m.pid == sid; };
      if (!orphans && std::ranges::none_of(members, is_leader)) {
        orphans = true;
        deadline = std::min(deadline, Clock::now() + kOrphanGrace);
      }
      wait_any_exit(members, deadline);
    }
  }
  const auto deadline = Clock::now() + kKillWait;
  for (;;) {
    if (leader) (void)reap(leader.get());
    std::vector<Member> members = session_members(sid);
    if (members.empty()) return ok();
    if (Clock::now() >= deadline) {
      std::string pids;
      for (const Member& m : members) pids += (pids.empty() ? "" : ", ") + std::to_string(m.pid);
      return std::unexpected(make_error(
          HostErrc::kSurvived,
          "processes of worker session " + std::to_string(sid) + " survived SIGKILL: " + pids));
    }
    for (const Member& m : members) (void)pidfd_signal(m.pidfd.get(), SIGKILL);
    wait_any_exit(members, deadline);
  }
}

std::string tail_of(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return "(no log: " + std::string(strerror(errno)) + ")";
  const off_t size = ::lseek(fd.get(), 0, SEEK_END);
  const off_t from = size > static_cast<off_t>(kTailBytes) ? size - kTailBytes : 0;
  std::string text(static_cast<size_t>(std::max<off_t>(size - from, 0)), '\0');
  const ssize_t n = ::pread(fd.get(), text.data(), text.size(), from);
  text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  size_t start = text.size();
  for (size_t lines = 0; start > 0 && lines < kTailLines; --start) {
    if (text[start - 1] == '\n' && ++lines == kTailLines) break;
  }
  text.erase(0, start);
  return text.empty() ? "(empty)" : text;
}

std::string command_of(const WorkerSpec& spec) {
  if (spec.argv.empty()) return spec.path;
  std::string out;
  for (const std::string& a : spec.argv) out += (out.empty() ? "" : " ") + a;
  return out;
}

// One worker of a launch, from spawn until it is ready or the launch fails.
struct Launch {
  const WorkerSpec* spec = nullptr;
  pid_t pid = -1;
  uint64_t start_time = 0;
  UniqueFd pidfd;
  UniqueFd ready;  // read end of the ready pipe; closed at EOF
  std::string line;
  bool has_address = false;
};

Status start_one(std::string_view job, const WorkerSpec& spec, Launch& out) {
  const auto fail = [&](HostErrc code, const std::string& why) {
    return std::unexpected(make_error(
        code, "job " + std::string(job) + ": worker `" + command_of(spec) + "`: " + why));
  };
  UniqueFd log(::open(spec.log.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644));
  if (!log) return fail(HostErrc::kSpawnFailed, "open log " + spec.log + ": " + strerror(errno));
  UniqueFd null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!null) return fail(HostErrc::kSpawnFailed, std::string("open /dev/null: ") + strerror(errno));
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return fail(HostErrc::kSpawnFailed, strerror(errno));
  UniqueFd ready_r(p[0]), ready_w(p[1]);
  ChildSpec child;
  child.path = spec.path;
  child.argv = spec.argv;
  child.env = spec.env;
  child.env.emplace_back(kReadyFdEnv, std::to_string(kReadyFd));
  child.die_with_parent = false;  // a worker outlives its controller
  child.new_session = true;
  child.fds = {{null.get(), 0}, {log.get(), 1}, {log.get(), 2}, {ready_w.get(), kReadyFd}};
  auto proc = spawn_process(child);
  if (!proc) return std::unexpected(std::move(proc.error()));
  out.spec = &spec;
  out.pid = proc->pid;
  out.ready = std::move(ready_r);
  // Unreaped, the child keeps its pid: what pidfd_open and /proc find is the worker.
  out.pidfd.reset(pidfd_open(out.pid));
  const int err = errno;
  const auto stat = read_stat(out.pid);
  if (!out.pidfd || !stat) {
    ::kill(out.pid, SIGKILL);
    siginfo_t info;
    while (waitid(P_PID, out.pid, &info, WEXITED) < 0 && errno == EINTR) {
    }
    out.pid = -1;
    return fail(HostErrc::kSpawnFailed,
                !out.pidfd ? std::string("pidfd_open: ") + strerror(err) : "no /proc entry");
  }
  out.start_time = stat->start_time;
  return ok();
}

// Reads what the worker wrote to its ready pipe. Returns false at EOF.
bool read_ready(Launch& w) {
  char buf[512];
  for (;;) {
    const ssize_t n = ::read(w.ready.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    w.line.append(buf, static_cast<size_t>(n));
    const size_t nl = w.line.find('\n');
    if (nl != std::string::npos) {
      w.line.resize(nl);
      w.has_address = true;
      return true;
    }
    return w.line.size() <= kMaxAddress;
  }
}

}  // namespace

std::optional<uint64_t> process_start_time(pid_t pid) {
  const auto s = read_stat(pid);
  if (!s || s->zombie()) return std::nullopt;
  return s->start_time;
}

bool worker_alive(const WorkerId& id) { return process_start_time(id.pid) == id.start_time; }

Status stop_worker(pid_t pid, std::optional<uint64_t> start_time, milliseconds grace) {
  if (pid <= 0) {
    return std::unexpected(
        make_error(HostErrc::kInvalidSpec, "stop_worker: bad pid " + std::to_string(pid)));
  }
  UniqueFd leader(pidfd_open(pid));
  const auto stat = leader ? read_stat(pid) : std::nullopt;
  if (stat && start_time && stat->start_time != *start_time) {
    // The pid was reused. It cannot be while the old session has members (the kernel keeps
    // a pid that is a session id), so the old session is empty: nothing to end (WP-3).
    return ok();
  }
  if (!stat) leader.reset();
  return end_session(pid, leader, stat && !stat->zombie(), grace);
}

Result<std::vector<LaunchedWorker>> launch_workers(std::string_view job,
                                                   const std::vector<WorkerSpec>& specs,
                                                   milliseconds timeout) {
  std::vector<Launch> launches(specs.size());
  const auto end_all = [&launches] {
    for (Launch& w : launches) {
      if (w.pid > 0) (void)stop_worker(w.pid, w.start_time, milliseconds(1000));
    }
  };
  for (size_t i = 0; i < specs.size(); ++i) {
    if (auto started = start_one(job, specs[i], launches[i]); !started) {
      end_all();
      return std::unexpected(std::move(started.error()));
    }
  }
  const auto failed = [&](const Launch& w, const std::string& why) {
    end_all();  // first, so that the log holds all the worker wrote
    return std::unexpected(make_error(
        HostErrc::kNotReady, "job " + std::string(job) + ": worker `" + command_of(*w.spec) +
                                 "` (pid " + std::to_string(w.pid) + ") " + why + "; log " +
                                 w.spec->log + ":\n" + tail_of(w.spec->log)));
  };
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    // The exits first: a worker that wrote its address and then died is not ready.
    std::vector<pollfd> exits;
    for (Launch& w : launches) exits.push_back({w.pidfd.get(), POLLIN, 0});
    if (::poll(exits.data(), exits.size(), 0) > 0) {
      for (size_t i = 0; i < exits.size(); ++i) {
        if (exits[i].revents == 0) continue;
        Launch& w = launches[i];
        const auto status = reap(w.pidfd.get());
        const std::string how = status ? status->to_string() : "exited";
        return failed(w, how + (w.has_address ? " right after it wrote its address"
                                              : " before it was ready"));
      }
    }
    const size_t waiting = static_cast<size_t>(
        std::ranges::count_if(launches, [](const Launch& w) { return !w.has_address; }));
    if (waiting == 0) break;
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      const Launch& w = *std::ranges::find_if(launches, [](const Launch& l) {
        return !l.has_address;
      });
      const std::string what =
          w.ready ? "did not write its address to " + std::string(kReadyFdEnv)
                  : "closed " + std::string(kReadyFdEnv) + " without writing an address";
      return failed(w, what + " within " + std::to_string(timeout.count()) + " ms (" +
                           std::to_string(waiting) + " of " + std::to_string(launches.size()) +
                           " workers not ready)");
    }
    // Wakes on an exit (a pidfd), on a ready line or EOF, or at the deadline.
    std::vector<pollfd> fds = std::move(exits);
    for (auto& f : fds) f.revents = 0;
    std::vector<Launch*> readers;
    for (Launch& w : launches) {
      if (w.has_address || !w.ready) continue;
      fds.push_back({w.ready.get(), POLLIN, 0});
      readers.push_back(&w);
    }
    const int n =
        ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left, INT32_MAX)));
    if (n < 0 && errno != EINTR) {
      const int err = errno;
      end_all();
      return std::unexpected(make_error(
          HostErrc::kSpawnFailed, "job " + std::string(job) + ": poll: " + strerror(err)));
    }
    for (size_t i = 0; n > 0 && i < readers.size(); ++i) {
      Launch& w = *readers[i];
      if (fds[launches.size() + i].revents == 0) continue;
      // At EOF, or past kMaxAddress without a newline, stop reading: the exit or the
      // deadline ends the wait.
      if (!read_ready(w) || w.has_address) w.ready.reset();
    }
  }
  std::vector<LaunchedWorker> out;
  for (Launch& w : launches) out.push_back({{w.pid, w.start_time}, std::move(w.line)});
  return out;
}

Status announce_ready(std::string_view address) {
  const char* var = ::getenv(kReadyFdEnv);
  if (var == nullptr) return ok();
  const std::string_view text(var);
  int fd = -1;
  if (std::from_chars(text.data(), text.data() + text.size(), fd).ec != std::errc() || fd < 0) {
    return std::unexpected(make_error(HostErrc::kInvalidSpec, std::string(kReadyFdEnv) +
                                                                  " is not a descriptor: '" +
                                                                  std::string(text) + "'"));
  }
  ::unsetenv(kReadyFdEnv);
  const std::string line = std::string(address) + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return std::unexpected(make_error(HostErrc::kSpawnFailed,
                                        "announce ready on fd " + std::to_string(fd) + ": " +
                                            strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return ok();
}

}  // namespace podium::host
