// Runtime: building one process's runtime from its services and wiring their system
// messages (make_runtime), the public accessors, and shutdown() in the reverse order of
// start (runtime_impl.h lists which file holds which role).
#include "podium/mesh/runtime.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <asio/post.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "podium/actor/executor.h"
#include "podium/actor/message.h"
#include "podium/base/log.h"
#include "podium/mesh/host_protocol.h"
#include "podium/mesh/job_config.h"
#include "podium/mesh/runtime_impl.h"

namespace podium::mesh {

namespace {

// How long shutdown() waits for another thread's shutdown to finish (ME-10).
constexpr std::chrono::seconds kShutdownWait{30};

std::chrono::milliseconds env_ms(const char* name, std::chrono::milliseconds fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long long ms = std::strtoll(v, &end, 10);
  if (*end || ms <= 0) {
    spdlog::warn("podium: ignoring {}={}: not a positive number of milliseconds", name, v);
    return fallback;
  }
  return std::chrono::milliseconds(ms);
}

}  // namespace

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  impl_->runtime = this;
}
Runtime::~Runtime() { shutdown(); }

actor::Proc& Runtime::proc() { return *impl_->proc; }
const std::string& Runtime::proc_key() const { return impl_->proc_key; }
Supervisor& Runtime::supervisor() { return *impl_->supervisor; }
Relay& Runtime::relay() { return *impl_->relay; }
void Runtime::shutdown() { impl_->shutdown(); }

// BT-2: the one way an unhandled fault ends the process.
void Runtime::Impl::exit_on_fault() {
  std::lock_guard lock(fault_mu);
  if (fault_exit.joinable()) return;  // under way
  fault_exit = std::thread([this] {
    shutdown();
    std::fflush(nullptr);
    ::_exit(1);
  });
}

std::function<void(actor::MeshFailure)> default_root_handler(Runtime::Impl& impl) {
  // An unhandled failure ends the process with status 1, as Python's default
  // unhandled_fault_hook does; from the fault-exit thread, since the runtime thread that
  // delivers it cannot join itself.
  return [&impl](actor::MeshFailure f) {
    spdlog::critical("podium: unhandled failure: {}", f.report());
    impl.exit_on_fault();
  };
}

void Runtime::Impl::shutdown() {
  {
    // BT-2: while a fault ends the process, every other caller waits for that end, so none
    // goes on to exit() and a status of its own. The first joins the fault thread (outside
    // fault_mu: that thread's own shutdown takes it); later ones wait for the same end.
    bool faulting = false, join = false;
    {
      std::lock_guard lock(fault_mu);
      faulting = fault_exit.joinable() && fault_exit.get_id() != std::this_thread::get_id();
      join = faulting && !fault_joining;
      if (join) fault_joining = true;
    }
    if (join) fault_exit.join();  // the thread ends the process: this does not return
    while (faulting) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  {
    // ME-10: a second caller (the main thread on its way to exit() while the fault thread
    // ends the process) waits until the first has finished. Returning at once would let it
    // run the static destructors under a shutdown still joining threads (std::terminate).
    // Bounded, in case the first caller waits on this thread.
    std::unique_lock lock(mu);
    if (stopping) {
      if (!stopped_cv.wait_for(lock, kShutdownWait, [&] { return stopped; })) {
        spdlog::warn("podium: shutdown() waited {} s for another thread's shutdown; going on",
                     std::chrono::duration_cast<std::chrono::seconds>(kShutdownWait).count());
      }
      return;
    }
    stopping = true;
  }
  // In the reverse order of start: the hosts are told while the loop still runs (the
  // workers answer), then timers, the agent, the spawner with its zygote, the children, the
  // loop, and last the output writer (what procs printed until then is written).
  detach_hosts();
  {
    std::lock_guard lock(mu);
    shut_down = true;
    if (host_timer) host_timer->cancel();
    if (sweep_timer) sweep_timer->cancel();
  }
  if (agent) agent->stop();
  actor::Executor::set_drivable(nullptr);
  if (spawner) spawner->stop();  // SIGKILL to every forked proc's group (ME-3), joined (PS-2)
  if (watcher) watcher->stop();  // SIGKILL to every proc group, reaped (ME-3)
  if (spawner) spawner->stop_output();  // the dead procs' last lines to their files (OP-2)
  if (proc) proc->stop();
  if (output) output->stop();
  std::string dir;
  {
    std::lock_guard lock(mu);
    dir = sock_dir;
  }
  for (const auto* d : {&dir, &worker_sock_dir}) {
    if (d->empty()) continue;
    std::error_code ec;
    std::filesystem::remove_all(*d, ec);
  }
  {
    std::lock_guard lock(mu);
    stopped = true;
  }
  stopped_cv.notify_all();
}

Result<std::unique_ptr<Runtime>> make_runtime(RuntimeConfig config) {
  base::init_logging();  // BL-1: log lines to stderr, the user's output alone on stdout
  auto impl = std::make_unique<Runtime::Impl>();
  impl->sock_dir = std::move(config.sock_dir);
  impl->worker_sock_dir = std::move(config.worker_sock_dir);
  auto secret = internal::job_secret();
  if (!secret) return std::unexpected(secret.error());
  auto tls = internal::job_tls();
  if (!tls) return std::unexpected(tls.error());
  channel::Config net_config;
  net_config.secret = std::move(*secret);
  net_config.tls = std::move(*tls);
  net_config.reuse_port = config.reuse_port;
  // Peers may send "cast" (relay.h) as soon as this proc listens, before its handlers are
  // registered and before Runtime::get() works: those wait for serve_held_system_ops().
  impl->clock = config.clock ? std::move(config.clock) : config.spawn.clock;
  impl->host_lost_after = env_ms("PODIUM_HOST_LOST_MS", impl->host_lost_after);
  impl->attach_timeout = env_ms("PODIUM_ATTACH_TIMEOUT_MS", impl->attach_timeout);
  net_config.via = config.spawn.via ? config.spawn.via : config.net_via;
  impl->via = config.spawn.via;
  actor::ProcConfig proc_config{std::move(config.listen), std::move(net_config), true};
  proc_config.clock = impl->clock;  // the proc's timers and its Net's read the same time
  proc_config.advertise = config.advertise;
  proc_config.listen_fd = config.listen_fd;
  proc_config.via = config.spawn.via;
  proc_config.via_timeout = impl->attach_timeout;
  if (config.worker && proc_config.listen.transport == channel::Transport::kTcp) {
    // GW-2..GW-4: a TCP worker is the gateway of clients that attach through it, known by
    // the address controllers dial (a wildcard bind: this host's address).
    channel::Address self = config.advertise ? *config.advertise : proc_config.listen;
    self.incarnation = 0;
    if (self.target == "0.0.0.0" || self.target == "::" || self.target.empty()) {
      self.target = default_host_address();
    }
    proc_config.gateway = self;
  }
  auto proc = actor::Proc::make(std::move(proc_config));
  if (!proc) return std::unexpected(proc.error());
  impl->proc = std::move(*proc);
  impl->proc_key = impl->proc->id().to_string();
  // Threads of this process that wait for replies drive the root proc's loop themselves.
  actor::Executor::set_drivable(&impl->proc->executor());
  impl->watcher = std::make_unique<host::ChildWatcher>(impl->proc->io());
  impl->spawner = std::make_unique<ProcSpawner>(impl->proc->io(), *impl->watcher,
                                                std::move(config.spawn.proc_argv),
                                                std::move(config.spawn.zygote_argv));
  impl->output = std::make_unique<OutputWriter>();
  impl->supervisor = std::make_unique<Supervisor>(*impl->proc);
  impl->supervisor->set_root_handler(config.fault_handler ? std::move(config.fault_handler)
                                                          : default_root_handler(*impl));
  impl->relay = std::make_unique<Relay>();
  impl->parent = std::move(config.parent);
  impl->ancestors = std::move(config.lineage);

  auto* raw = impl.get();
  auto& p = *impl->proc;
  using H = const actor::SystemHeader&;
  // Handlers that only need the sender; `fn` is a member of Impl.
  auto on = [&p, raw](const char* op, void (Runtime::Impl::*fn)(H, const std::string&)) {
    p.on_system(op, [raw, fn](H h, wire::Envelope&& env) { (raw->*fn)(h, env.sender); });
  };
  p.on_system("cast", [raw](H h, wire::Envelope&& env) { raw->relay->on_cast(h, std::move(env)); });
  p.on_system("actor_failed",
              [raw](H h, wire::Envelope&& env) { raw->on_actor_failed(h, std::move(env)); });
  on(proto::Ready::kOp, &Runtime::Impl::on_ready);
  on(proto::ProcExit::kOp, &Runtime::Impl::on_proc_exit);
  on(proto::KillRequest::kOp, &Runtime::Impl::on_kill);
  on(proto::AdoptProcs::kOp, &Runtime::Impl::on_adopt);
  p.on_undeliverable([raw](const wire::Envelope& env, const Error& why) {
    raw->on_undeliverable(env, why);
  });
  impl->spawner->start();
  if (config.worker) {
    impl->agent = std::make_unique<HostAgent>(p, *impl->spawner, *impl->output,
                                               config.persistent, impl->clock);
    if (config.until_shutdown) impl->agent->end_on_shutdown();
    if (!impl->worker_sock_dir.empty()) impl->agent->use_unix_sockets(impl->worker_sock_dir);
    if (auto st = impl->agent->start(); !st) return std::unexpected(st.error());
  } else {
    // The controller side of attached hosts.
    on(proto::HostAttached::kOp, &Runtime::Impl::on_host_attached);
    on(proto::HostSpawned::kOp, &Runtime::Impl::on_host_spawned);
    on(proto::HostProcExit::kOp, &Runtime::Impl::on_host_proc_exit);
    on(proto::HostFound::kOp, &Runtime::Impl::on_host_found);
    on(proto::HostOutput::kOp, &Runtime::Impl::on_host_output);
    on(proto::WorkerBeat::kOp, &Runtime::Impl::on_worker_beat);
  }
  return std::make_unique<Runtime>(std::move(impl));
}

}  // namespace podium::mesh
