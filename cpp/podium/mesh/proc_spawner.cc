#include "podium/mesh/proc_spawner.h"

#include <spdlog/spdlog.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <cerrno>
#include <filesystem>

#include "podium/base/write_all.h"
#include "podium/host/stdio_gate.h"
#include "podium/host/zygote.h"
#include "podium/mesh/bootstrap.h"

namespace podium::mesh {

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("/proc/self/exe") : p.string();
}

void JobThread::start() {
  std::lock_guard lock(mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] { main(); });
  id_ = thread_.get_id();
}

bool JobThread::post(std::function<void()> job) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return false;
    auto j = std::make_shared<Job>();
    j->run = std::move(job);
    jobs_.push_back(std::move(j));
  }
  cv_.notify_all();
  return true;
}

void JobThread::main() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (stopping_) return;
    auto job = std::move(jobs_.front());
    jobs_.pop_front();
    job->started = true;
    lock.unlock();
    job->run();
    job.reset();
    lock.lock();
  }
}

void JobThread::stop() {
  std::deque<std::shared_ptr<Job>> dropped;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    dropped.swap(jobs_);
  }
  cv_.notify_all();
  for (auto& j : dropped) {
    if (j->cancel) j->cancel();
  }
  if (thread_.joinable() && !on_this_thread()) thread_.join();
}

ProcSpawner::ProcSpawner(asio::io_context& io, host::ChildWatcher& watcher,
                         std::vector<std::string> proc_argv, std::vector<std::string> zygote_argv)
    : io_(io),
      watcher_(watcher),
      proc_argv_(proc_argv.empty() ? std::vector<std::string>{self_exe()} : std::move(proc_argv)),
      zygote_argv_(std::move(zygote_argv)),
      spawn_env_(SpawnCommands{proc_argv_, zygote_argv_}.encode()),
      pumps_(std::make_unique<host::OutputPumps>()) {}

// Made at the first spawn (a process that spawns nothing has no watcher thread); a kernel
// without futex_waitv or memfd leaves procs to their reap, as before.
std::shared_ptr<host::DeathWatch> ProcSpawner::death_watch() {
  std::lock_guard lock(mu_);
  if (!death_watch_ && !death_watch_failed_ && !stopped_) {
    if (auto dw = host::DeathWatch::create()) {
      death_watch_ = std::move(*dw);
    } else {
      death_watch_failed_ = true;
      spdlog::debug("podium: no early death notice for procs: {}", dw.error().to_string());
    }
  }
  return death_watch_;
}

ProcSpawner::~ProcSpawner() {
  stop();
  stop_output();
}

void ProcSpawner::stop_output(std::chrono::milliseconds grace) { pumps_->stop(grace); }

void ProcSpawner::set_output_sink(host::OutputPumps::Sink sink) { sink_ = std::move(sink); }

// What a proc wrote to fd 1 or 2, after its log file: to the sink, else where the procs'
// output went before the pumps (the output fds, or this process's own).
void ProcSpawner::emit(int stream, std::string_view data) const {
  if (sink_) {
    sink_(stream, data);
    return;
  }
  if (out_fd_[0] < 0) {  // this process's own: never inside one of its own lines (SG-1)
    host::StdioGate::instance().write_lines(stream == 2 ? 2 : 1, data);
    return;
  }
  (void)write_all(out_fd_[stream == 2 ? 1 : 0], data);  // a closed terminal: the log has them
}

namespace {
std::string this_host() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}
}  // namespace

void ProcSpawner::pump(pid_t pid, host::ProcPipes pipes, const std::string& log_dir) {
  std::string path = host::proc_log_path(log_dir, pid);
  auto file = host::LogFile::open(path, host::proc_log_max_bytes());
  if (!file) {
    spdlog::warn("podium: proc {} on {}: cannot open its log file {}: {}; its output goes on "
                 "without it", pid, this_host(), path, file.error().to_string());
  }
  pumps_->add("pid " + std::to_string(pid), std::move(pipes),
              file ? std::move(*file) : nullptr,
              [this](int stream, std::string_view data) { emit(stream, data); });
}

void ProcSpawner::start() {
  // Each proc costs this process four descriptors for its output (three pipes and its log
  // file, PS-4) besides its pidfd and connections: a soft limit of 1024 would cap a host at
  // ~150 procs. Raised towards the hard limit, as many runtimes do.
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < kWantedFds &&
      nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = std::min<rlim_t>(nofile.rlim_max, kWantedFds);
    (void)::setrlimit(RLIMIT_NOFILE, &nofile);
  }
  thread_.start();
}

void ProcSpawner::stop() {
  std::shared_ptr<host::Zygote> zygote;
  std::shared_ptr<host::DeathWatch> dw;
  {
    std::lock_guard lock(mu_);
    zygote = std::move(zygote_);
    dw = death_watch_;
    stopped_ = true;
  }
  if (dw) dw->stop();  // no on_dying after this
  if (zygote) zygote->stop();  // SIGKILL to every forked proc's group (ME-3)
  thread_.stop();
}

void ProcSpawner::set_output_fds(int out, int err) {
  out_fd_[0] = out;
  out_fd_[1] = err;
}

void ProcSpawner::add_output_fds(host::ChildSpec& spec) const {
  if (out_fd_[0] < 0) return;
  spec.fds.push_back(host::PassFd{out_fd_[0], 1});
  spec.fds.push_back(host::PassFd{out_fd_[1], 2});
}

std::shared_ptr<host::Zygote> ProcSpawner::zygote_for_spawn() {
  if (zygote_argv_.empty()) return nullptr;
  {
    std::lock_guard lock(mu_);
    if (zygote_failed_) return nullptr;
    if (zygote_ && zygote_->alive()) return zygote_;
  }
  // PS-3: the check and the start run together on the spawner's one thread, so callers that
  // raced past the check above share the zygote the first of them started; replacing a live
  // one would SIGKILL the procs already forked from it (ME-3).
  auto started = thread_.run<std::shared_ptr<host::Zygote>>(
      [&]() -> Result<std::shared_ptr<host::Zygote>> {
        {
          std::lock_guard lock(mu_);
          if (zygote_failed_) return std::shared_ptr<host::Zygote>{};
          if (zygote_ && zygote_->alive()) return zygote_;
        }
        host::ChildSpec spec;
        spec.path = zygote_argv_[0];
        spec.argv = zygote_argv_;
        add_output_fds(spec);
        // Its children inherit the death watch's memfd (DW-1).
        if (auto dw = death_watch()) {
          spec.fds.push_back(host::PassFd{dw->fd(), host::DeathWatch::kChildFd});
        }
        auto zygote = host::Zygote::start(io_, watcher_, spec);
        if (!zygote) return std::unexpected(zygote.error());
        std::lock_guard lock(mu_);
        zygote_ = std::move(*zygote);
        return zygote_;
      },
      kSpawnWait);
  if (started) return *started;
  if (started.error().is(MeshErrc::kShutDown)) return nullptr;
  std::lock_guard lock(mu_);
  if (!zygote_failed_) {
    spdlog::warn("podium: cannot start the zygote ({}); procs start as new processes",
                 started.error().to_string());
  }
  zygote_failed_ = true;
  return nullptr;
}

// A launch's binding goes to the proc in PODIUM_PROC_BIND (LA-1), its variables after the
// spawner's; its own program, and removed variables or an empty environment (through
// env(1), which then sets every variable itself), replace the default command.
void ProcSpawner::apply_launch(const ProcLaunch& launch, host::ChildSpec& spec) {
  if (!launch.bind.empty()) spec.env.emplace_back(kBindEnv, encode_bind(launch.bind));
  for (const auto& kv : launch.env) spec.env.push_back(kv);
  if (launch.program.empty()) return;
  spec.path = launch.program;
  spec.argv = launch.argv;
  if (launch.unset.empty() && launch.inherit_env) return;
  std::vector<std::string> argv{"env"};
  if (!launch.inherit_env) argv.push_back("-i");
  for (const auto& name : launch.unset) argv.insert(argv.end(), {"-u", name});
  for (const auto& [k, v] : spec.env) argv.push_back(k + "=" + v);
  argv.push_back(spec.path);
  argv.insert(argv.end(), spec.argv.begin() + (spec.argv.empty() ? 0 : 1), spec.argv.end());
  spec.path = "/usr/bin/env";
  spec.argv = std::move(argv);
}

Result<pid_t> ProcSpawner::spawn(const ProcCommand& cmd, host::OnExit on_exit,
                                 host::OnExit on_dying) {
  host::ChildSpec spec;
  spec.path = proc_argv_[0];
  spec.argv = proc_argv_;
  spec.env = cmd.env;
  spec.env.emplace_back(kSpawnEnv, spawn_env_);  // BT-3: its own procs start as this one's
  // DW-1: a slot of the death watch, or none (an empty value: not one inherited from us).
  std::shared_ptr<host::DeathWatch> dw = on_dying ? death_watch() : nullptr;
  std::optional<size_t> slot = dw ? dw->reserve() : std::nullopt;
  spec.env.emplace_back(host::DeathWatch::kEnv, slot ? host::DeathWatch::env_value(*slot) : "");
  if (slot) {
    on_exit = [dw, s = *slot, on_exit = std::move(on_exit)](const host::ExitStatus& st) {
      dw->release(s);  // DW-2: reaped, the slot is free
      if (on_exit) on_exit(st);
    };
  }
  // PS-4: the proc's fds 1, 2 and 3 are pipes this process reads.
  auto pipes = host::make_proc_pipes();
  if (!pipes) {
    if (slot) dw->release(*slot);
    return std::unexpected(pipes.error());
  }
  spec.fds = {{pipes->out_w.get(), 1}, {pipes->err_w.get(), 2},
              {pipes->log_w.get(), host::kProcLogFd}};
  spec.env.emplace_back(host::kProcLogFdEnv, std::to_string(host::kProcLogFd));
  std::string log_dir_env;
  for (const auto& kv : cmd.env) {
    if (kv.first == "PODIUM_LOG_DIR") log_dir_env = kv.second;
  }
  for (const auto& kv : cmd.launch.env) {
    if (kv.first == "PODIUM_LOG_DIR") log_dir_env = kv.second;
  }
  apply_launch(cmd.launch, spec);
  Result<pid_t> pid = std::unexpected(Error{});
  if (auto zygote = cmd.launch.program.empty() ? zygote_for_spawn() : nullptr) {
    std::error_code ec;
    std::string cwd = std::filesystem::current_path(ec).string();
    host::ZygoteChild child{spec.argv, host::current_environment(spec.env), cwd};
    child.fds = spec.fds;  // the death watch's memfd the child inherits from the zygote
    pid = zygote->spawn(child, std::move(on_exit));
  } else {
    if (slot) spec.fds.push_back(host::PassFd{dw->fd(), host::DeathWatch::kChildFd});
    pid = thread_.run<pid_t>([&]() -> Result<pid_t> { return watcher_.spawn(spec, on_exit); },
                             kSpawnWait);
  }
  if (slot) {
    if (!pid) {
      dw->release(*slot);
    } else {
      dw->watch(*slot, *pid, [this, on_dying = std::move(on_dying)](const host::ExitStatus& st) {
        asio::post(io_, [on_dying, st] { on_dying(st); });
      });
    }
  }
  if (!pid) return pid;  // the pipes close with `pipes`
  pipes->out_w.reset();  // only the proc holds the write ends now: its death is their EOF
  pipes->err_w.reset();
  pipes->log_w.reset();
  pump(*pid, std::move(pipes->read), host::proc_log_dir(log_dir_env));
  return pid;
}

bool ProcSpawner::kill_group(pid_t pid, int sig) {
  std::shared_ptr<host::Zygote> z;
  {
    std::lock_guard lock(mu_);
    z = zygote_;
  }
  if (z && z->kill_group(pid, sig)) return true;
  return static_cast<bool>(watcher_.kill_group(pid, sig));
}

}  // namespace podium::mesh
