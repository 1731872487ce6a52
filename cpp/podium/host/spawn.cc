#include "podium/host/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <string>
#include <unordered_set>

#include "podium/host/error.h"

extern char** environ;

namespace podium::host {
namespace {

struct FdMove {
  int from;
  int to;
  int temp;  // the child's copy of `from` above every target
};

// What a child that could not exec writes to the report pipe before _exit. `step` points to
// a string literal, valid in the parent too.
struct ExecFailure {
  int err;
  const char* step;
};

// Everything the child needs, prepared by the parent. The child writes only `moves[].temp`.
struct ExecPlan {
  const char* path;
  char* const* argv;
  char* const* envp;
  const char* cwd;  // nullptr: inherit
  bool die_with_parent;
  bool new_process_group;
  bool new_session;
  pid_t parent_pid;
  FdMove* moves;  // sorted by `to`
  size_t num_moves;
  int temp_base;  // above every target, so a temporary copy never lands on a target
  int fd_limit;   // bound of the close-on-exec sweep when close_range is unavailable
  int report_fd;  // write end of the close-on-exec report pipe
};

// Marks [lo, hi] close-on-exec. Async-signal-safe.
void cloexec_range(unsigned lo, unsigned hi, int fd_limit) {
  if (lo > hi || close_range(lo, hi, CLOSE_RANGE_CLOEXEC) == 0) return;
  for (long fd = lo; fd <= static_cast<long>(hi) && fd < fd_limit; ++fd) {
    fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  }
}

[[noreturn]] void child_failed(int report_fd, const char* step) {
  const ExecFailure failure{errno, step};
  while (write(report_fd, &failure, sizeof failure) < 0 && errno == EINTR) {
  }
  _exit(127);
}

// Runs in the vforked child: async-signal-safe calls only, no return.
[[noreturn]] void exec_child(ExecPlan& p) {
  // A handler inherited from the parent would run on the parent's memory once the mask is
  // cleared below; an inherited SIG_IGN would survive exec. Start from SIG_DFL everywhere.
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &dfl, nullptr);  // EINVAL for some: fine

  // Out of the way of the targets, like the fds to pass.
  const int report = fcntl(p.report_fd, F_DUPFD_CLOEXEC, p.temp_base);
  if (report < 0) child_failed(p.report_fd, "fcntl(F_DUPFD_CLOEXEC)");
  if (p.new_session) {
    if (setsid() < 0) child_failed(report, "setsid");
  } else if (p.new_process_group && setpgid(0, 0) != 0) {
    child_failed(report, "setpgid");
  }
  if (p.die_with_parent) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) child_failed(report, "prctl(PR_SET_PDEATHSIG)");
    // The parent may have died before prctl: then no signal will ever come.
    if (getppid() != p.parent_pid) _exit(127);
  }
  if (p.cwd != nullptr && chdir(p.cwd) != 0) child_failed(report, "chdir");
  // Two passes so that a target never overwrites a source still to be moved; dup2 clears
  // FD_CLOEXEC on the target, also for a source already at its target.
  for (size_t i = 0; i < p.num_moves; ++i) {
    p.moves[i].temp = fcntl(p.moves[i].from, F_DUPFD_CLOEXEC, p.temp_base);
    if (p.moves[i].temp < 0) child_failed(report, "fcntl(F_DUPFD_CLOEXEC)");
  }
  for (size_t i = 0; i < p.num_moves; ++i) {
    if (dup2(p.moves[i].temp, p.moves[i].to) < 0) child_failed(report, "dup2");
  }
  unsigned lo = 3;
  for (size_t i = 0; i < p.num_moves; ++i) {
    const unsigned to = static_cast<unsigned>(p.moves[i].to);
    if (to < lo) continue;
    if (to > lo) cloexec_range(lo, to - 1, p.fd_limit);
    lo = to + 1;
  }
  cloexec_range(lo, UINT_MAX, p.fd_limit);

  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execve(p.path, p.argv, p.envp);
  child_failed(report, "execve");
}

// Kept out of line with only `plan` live across vfork, which returns twice. Under TSan or
// valgrind vfork is a plain fork: nothing here relies on the child sharing our memory.
[[gnu::noinline]] pid_t vfork_exec(ExecPlan& plan) {
  const pid_t pid = vfork();
  if (pid == 0) exec_child(plan);
  return pid;
}

Status validate(const ChildSpec& spec) {
  auto invalid = [&spec](std::string why) {
    return std::unexpected(make_error(HostErrc::kInvalidSpec, "spawn " + spec.path + ": " + why));
  };
  if (spec.path.empty()) return invalid("empty executable path");
  for (const auto& [name, value] : spec.env) {
    if (name.empty() || name.find('=') != std::string::npos) {
      return invalid("bad environment variable name '" + name + "'");
    }
  }
  std::unordered_set<int> targets;
  for (const PassFd& f : spec.fds) {
    const std::string what = "fd " + std::to_string(f.fd) + " as " + std::to_string(f.target);
    if (f.target < 0 || !targets.insert(f.target).second) return invalid(what + ": bad target");
    if (spec.capture_output && (f.target == 1 || f.target == 2)) {
      return invalid(what + ": target is a captured stream");
    }
    if (fcntl(f.fd, F_GETFD) < 0) return invalid(what + ": " + strerror(errno));
  }
  return ok();
}

std::vector<std::string> child_environment(const ChildSpec& spec) {
  std::unordered_set<std::string_view> replaced;
  for (const auto& [name, value] : spec.env) replaced.insert(name);
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (!replaced.contains(entry.substr(0, entry.find('=')))) env.emplace_back(entry);
  }
  for (const auto& [name, value] : spec.env) env.push_back(name + "=" + value);
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// errno_text(err), and for EMFILE what holds the descriptors: a spawner holds some for every
// proc it starts (PS-4: about 6 each), so a host of thousands of procs meets the hard
// RLIMIT_NOFILE, which only its administrator can raise (HO-7).
std::string spawn_errno_text(int err) {
  std::string text = errno_text(err);
  if (err == EMFILE) text += "; each proc a podium spawner starts holds about 6 of them there";
  return text;
}

void reap(pid_t pid) {
  siginfo_t info;
  while (waitid(P_PID, pid, &info, WEXITED) < 0 && errno == EINTR) {
  }
}

}  // namespace

Result<SpawnedProcess> spawn_process(const ChildSpec& spec) {
  if (auto valid = validate(spec); !valid) return std::unexpected(valid.error());
  auto sys_error = [&spec](const char* call, int err) {
    return std::unexpected(make_error(
        HostErrc::kSpawnFailed, "spawn " + spec.path + ": " + call + ": " + spawn_errno_text(err)));
  };

  std::vector<std::string> args = spec.argv.empty() ? std::vector{spec.path} : spec.argv;
  std::vector<std::string> env = child_environment(spec);
  std::vector<char*> argv = pointers(args);
  std::vector<char*> envp = pointers(env);

  std::vector<FdMove> moves;
  for (const PassFd& f : spec.fds) moves.push_back({f.fd, f.target, -1});
  SpawnedProcess proc;
  UniqueFd out_w, err_w;
  if (spec.capture_output) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0) return sys_error("pipe2", errno);
    proc.out.reset(out[0]);
    out_w.reset(out[1]);
    if (pipe2(err, O_CLOEXEC) != 0) return sys_error("pipe2", errno);
    proc.err.reset(err[0]);
    err_w.reset(err[1]);
    moves.push_back({out_w.get(), 1, -1});
    moves.push_back({err_w.get(), 2, -1});
  }
  std::ranges::sort(moves, {}, &FdMove::to);
  // EOF on this pipe means the child exec'd; an ExecFailure means it could not.
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) return sys_error("pipe2", errno);
  UniqueFd report_r(report[0]), report_w(report[1]);

  rlimit nofile = {};
  getrlimit(RLIMIT_NOFILE, &nofile);
  ExecPlan plan = {
      .path = spec.path.c_str(),
      .argv = argv.data(),
      .envp = envp.data(),
      .cwd = spec.cwd ? spec.cwd->c_str() : nullptr,
      .die_with_parent = spec.die_with_parent,
      .new_process_group = spec.new_process_group,
      .new_session = spec.new_session,
      .parent_pid = getpid(),
      .moves = moves.data(),
      .num_moves = moves.size(),
      .temp_base = moves.empty() ? 3 : std::max(3, moves.back().to + 1),
      .fd_limit = static_cast<int>(std::min<rlim_t>(nofile.rlim_cur, 1 << 20)),
      .report_fd = report_w.get(),
  };

  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  const pid_t pid = vfork_exec(plan);
  const int vfork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);

  if (pid < 0) return sys_error("vfork", vfork_errno);
  report_w.reset();
  ExecFailure failure = {};
  ssize_t n;
  while ((n = read(report_r.get(), &failure, sizeof failure)) < 0 && errno == EINTR) {
  }
  if (n == sizeof failure) {
    reap(pid);
    return std::unexpected(make_error(
        HostErrc::kExecFailed,
        "spawn " + spec.path + ": " + failure.step + ": " + spawn_errno_text(failure.err)));
  }
  if (n != 0) {  // cannot happen (a short pipe write); do not leave a child we cannot account for
    const int err = n < 0 ? errno : EPROTO;
    ::kill(pid, SIGKILL);
    reap(pid);
    return sys_error("read exec report", err);
  }
  proc.pid = pid;
  return proc;
}

}  // namespace podium::host
