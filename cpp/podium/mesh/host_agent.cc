#include "podium/mesh/host_agent.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <asio/post.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <cstdio>

#include "podium/actor/message.h"
#include "podium/mesh/bootstrap.h"
#include "podium/ndslice/codec.h"

namespace podium::mesh {

// The procs' stdout and stderr (fds 1 and 2 of every proc and of the zygote) are these
// pipes' write ends; what the read ends yield goes to the controller (host_output).
struct HostAgent::Output {
  int write_fd[2] = {-1, -1};
  std::unique_ptr<asio::posix::stream_descriptor> reader[2];
  std::array<char, 16384> buf[2];
};

bool HostAgent::Mesh::all_exited() const {
  return std::all_of(exits.begin(), exits.end(), [](const auto& e) { return !e.empty(); });
}

HostAgent::HostAgent(actor::Proc& proc, ProcSpawner& spawner, OutputWriter& output,
                     bool persistent, std::shared_ptr<base::Clock> clock)
    : proc_(proc),
      spawner_(spawner),
      output_(output),
      persistent_(persistent),
      clock_(std::move(clock)),
      key_(proc.id().to_string()),
      out_(std::make_unique<Output>()),
      timer_(std::make_unique<base::Timer>(proc.io(), clock_)),
      exit_timer_(std::make_unique<base::Timer>(proc.io(), clock_)) {}

HostAgent::~HostAgent() {
  stop();
  for (int fd : out_->write_fd) {
    if (fd >= 0) ::close(fd);
  }
}

std::string HostAgent::where() const {
  return "host " + actor::host_name() + " (worker " + key_ + ")";
}

Status HostAgent::start() {
  using H = const actor::SystemHeader&;
  auto on = [this](const char* op, void (HostAgent::*fn)(H, const std::string&)) {
    proc_.on_system(op, [this, fn](H h, wire::Envelope&& env) { (this->*fn)(h, env.sender); });
  };
  on(proto::HostAttach::kOp, &HostAgent::on_attach);
  on(proto::HostSpawn::kOp, &HostAgent::on_spawn);
  on(proto::HostKill::kOp, &HostAgent::on_kill);
  on(proto::HostDetach::kOp, &HostAgent::on_detach);
  on(proto::HostLookup::kOp, &HostAgent::on_lookup);
  on(proto::ControllerBeat::kOp, &HostAgent::on_beat);
  for (int i = 0; i < 2; ++i) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return std::unexpected(errno_error("pipe2", errno));
    out_->write_fd[i] = fds[1];
    out_->reader[i] = std::make_unique<asio::posix::stream_descriptor>(proc_.io(), fds[0]);
    read_output(i);
  }
  spawner_.set_output_fds(out_->write_fd[0], out_->write_fd[1]);  // the zygote's
  // The procs' fds 1 and 2 are pumped by the spawner (PS-4): after their log files, on to
  // the controller served (HA-6).
  spawner_.set_output_sink(
      [this](int fd, std::string_view data) { forward_output(fd, std::string(data)); });
  spawns_.start();
  asio::post(proc_.io(), [this] { tick(); });
  return ok();
}

void HostAgent::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    timer_->cancel();
    exit_timer_->cancel();
  }
  spawns_.stop();
}

bool HostAgent::expects_undeliverable(const std::string& dest_key) {
  std::lock_guard lock(mu_);
  return controller_key_ != dest_key;
}

void HostAgent::refuse(const std::string& op, const std::string& sender, const std::string& why) {
  refused_.fetch_add(1);
  refusals_.warn("podium worker: refused {} from {}: {}", op,
                 sender.empty() ? std::string("an unnamed sender") : sender, why);
}

void HostAgent::send(const channel::Address& to, actor::SystemHeader h) {
  proc_.send(to, actor::system_message(proc_.id(), actor::ProcId{to}, h));
}

void HostAgent::answer(const std::string& sender, actor::SystemHeader h) {
  auto who = actor::system_sender_proc(sender);
  if (!who) {
    refuse(h.op, sender, "cannot answer: " + who.error().message);
    return;
  }
  send(who->addr, std::move(h));
}

std::optional<std::string> HostAgent::not_controller(const std::string& sender) {
  auto who = actor::system_sender_proc(sender);
  if (!who) return who.error().message;
  std::lock_guard lock(mu_);
  if (stopped_) return std::string("this worker is stopping");
  if (!controller_) return "this worker serves no controller (the sender is " + sender + ")";
  if (who->addr != *controller_) {
    return "the sender " + who->addr.to_string() + " is not the controller this worker serves (" +
           controller_key_ + ")";
  }
  last_heard_ = base::now_of(clock_);  // any word from it counts as a heartbeat
  return std::nullopt;
}

void HostAgent::on_attach(const actor::SystemHeader& h, const std::string& sender) {
  auto m = proto::HostAttach::decode(h);
  if (!m) {
    // Numbers [host mesh, index] may be readable: answer so the controller hears why.
    if (h.numbers.size() >= 2) {
      answer(sender, proto::HostAttached{m.error().message, actor::host_name(), h.numbers[0],
                                         h.numbers[1], static_cast<uint64_t>(::getpid())}
                         .encode());
    }
    return refuse(h.op, sender, m.error().message);
  }
  auto who = actor::system_sender_proc(sender);
  if (!who || who->addr != m->controller) {
    std::string why = "the sender " + sender + " is not the controller it names (" +
                      m->controller.to_string() + ")";
    refuse(h.op, sender, why);
    return send(m->controller, proto::HostAttached{why, actor::host_name(), m->host_mesh,
                                                   m->host_index,
                                                   static_cast<uint64_t>(::getpid())}
                                   .encode());
  }
  std::string key = m->controller.to_string();
  std::string refusal;
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    if (controller_ && *controller_ != m->controller) {
      refusal = "worker " + key_ + " on host " + actor::host_name() +
                " serves another controller (" + controller_key_ + ")";  // HA-1
    } else {
      controller_ = m->controller;
      controller_key_ = key;
      advertise_ = m->advertise;
      host_mesh_ = m->host_mesh;
      host_index_ = m->host_index;
      uint64_t used = std::clamp<uint64_t>(m->lost_after_ms, kMinLostAfterMs, kMaxLostAfterMs);
      if (used != m->lost_after_ms) {  // HA-9
        spdlog::warn("podium worker: controller {} asked for a lost-after of {} ms; using {} ms",
                     key, m->lost_after_ms, used);
      }
      lost_after_ = std::chrono::milliseconds(used);
      last_heard_ = base::now_of(clock_);
    }
  }
  if (refusal.empty()) {
    spdlog::info("podium worker: serving controller {}", key);
    // Beats and HA-5's verdict on the lost-after just given, from now on.
    asio::post(proc_.io(), [this] { tick(); });
  } else {
    spdlog::warn("podium worker: refused controller {}: {}", key, refusal);
  }
  send(m->controller, proto::HostAttached{refusal, actor::host_name(), m->host_mesh,
                                          m->host_index, static_cast<uint64_t>(::getpid())}
                          .encode());
}

void HostAgent::on_beat(const actor::SystemHeader& h, const std::string& sender) {
  auto m = proto::ControllerBeat::decode(h);
  if (!m) return refuse(h.op, sender, m.error().message);
  // A beat from a controller this worker no longer serves (it was released) is expected.
  (void)not_controller(sender);
}

void HostAgent::on_spawn(const actor::SystemHeader& h, const std::string& sender) {
  auto m = proto::HostSpawn::decode(h);
  auto refused = [&](const std::string& why) {
    refuse(h.op, sender, why);
    if (!h.numbers.empty()) {
      answer(sender, proto::HostSpawned{h.numbers[0], where() + ": " + why, {}}.encode());
    }
  };
  if (!m) return refused(m.error().message);
  if (auto why = not_controller(sender)) return refused(*why);
  if (!spawns_.post([this, m = std::move(*m)]() mutable { spawn(std::move(m)); })) {
    refused("this worker is stopping");
  }
}

HostAgent::Mesh* HostAgent::live_mesh_named(const std::string& name) {
  for (auto& m : meshes_) {
    if (m.name == name && !m.all_exited()) return &m;
  }
  return nullptr;
}

HostAgent::Mesh* HostAgent::mesh_by_serial(uint64_t serial) {
  for (auto& m : meshes_) {
    if (m.serial == serial) return &m;
  }
  return nullptr;
}

// On the spawn thread.
void HostAgent::spawn(proto::HostSpawn msg) {
  const auto to = msg.controller;
  auto refuse_spawn = [&](const std::string& why) {
    send(to, proto::HostSpawned{msg.request, where() + ": " + why, {}}.encode());
  };
  // HA-9: a count is checked before it is believed (each proc is a fork).
  if (msg.count == 0 || msg.count > kMaxProcsPerSpawn) {
    return refuse_spawn("asked for " + std::to_string(msg.count) + " procs; a worker starts 1 to " +
                        std::to_string(kMaxProcsPerSpawn) + " per request");
  }
  std::vector<ProcLaunch> launches;  // LA-1: checked before any proc starts
  for (const auto& bytes : msg.launches) {
    auto launch = ProcLaunch::decode(bytes);
    if (!launch) return refuse_spawn(launch.error().to_string());
    launches.push_back(std::move(*launch));
  }
  std::string controller_key = to.to_string();
  std::string advertise;
  uint64_t serial = 0;
  {
    // The mesh is recorded before its first child starts: an exit, however early, finds it.
    std::lock_guard lock(mu_);
    if (stopped_) return;
    advertise = advertise_;
    if (!msg.name.empty()) {
      if (const auto* m = live_mesh_named(msg.name)) {
        return refuse_spawn("a proc mesh named '" + msg.name + "' runs here already (" +
                            std::to_string(m->keys.size()) + " procs, controller " +
                            m->controller + "); stop it, or choose another name");
      }
      // One whose procs all exited gives its name to the new one.
      std::erase_if(meshes_, [&](const Mesh& old) { return old.name == msg.name; });
    }
    Mesh m;
    m.serial = serial = ++next_serial_;
    m.name = msg.name;
    m.extent = ndslice::encode(msg.extent);
    m.first = msg.first;
    m.controller = controller_key;
    meshes_.push_back(std::move(m));
  }
  proto::HostSpawned answer{msg.request, "", {}};
  std::vector<std::string> started;
  auto fail = [&](const std::string& why) {
    std::vector<pid_t> kill;
    {
      std::lock_guard lock(mu_);
      for (const auto& key : started) {
        if (auto it = children_.find(key); it != children_.end()) kill.push_back(it->second.pid);
      }
      std::erase_if(meshes_, [&](const Mesh& m) { return m.serial == serial; });
    }
    for (pid_t pid : kill) (void)spawner_.kill_group(pid, SIGKILL);
    refuse_spawn(why);
  };
  for (uint64_t r = msg.first; r < msg.first + msg.count; ++r) {
    std::optional<channel::PortReservation> port;
    channel::Address listen;
    if (!unix_dir_.empty()) {  // an ipc:// worker: its procs on Unix sockets (CH-16)
      listen = channel::Address{channel::Transport::kUnix,
                                unix_dir_ + "/s" + std::to_string(serial) + "-" +
                                    std::to_string(r) + ".sock",
                                0};
    } else {
      auto reserved = channel::PortReservation::make(advertise);
      if (!reserved) return fail(reserved.error().to_string());
      port.emplace(std::move(*reserved));
      // A fresh incarnation: the port may have been a dead proc's (CH-12).
      listen = channel::Address{channel::Transport::kTcp, advertise, port->port(),
                                channel::new_incarnation()};
    }
    std::string key = listen.to_string();
    Boot boot{to, listen, msg.proc_mesh, r, port.has_value()};
    {
      // The exit callback looks the child and its mesh up: register both first.
      std::lock_guard lock(mu_);
      children_.insert_or_assign(key, Child{-1, std::move(port)});
      if (auto* m = mesh_by_serial(serial)) {
        m->keys.push_back(key);
        m->pids.push_back(-1);
        m->exits.emplace_back();
      }
    }
    ProcCommand cmd{{{kBootEnv, boot.encode()}},
                    launches.empty() ? ProcLaunch{} : launches[r - msg.first]};
    auto pid = spawner_.spawn(cmd,
                              [this, key](const host::ExitStatus& s) { child_exited(key, s); });
    if (!pid) {
      {
        std::lock_guard lock(mu_);
        children_.erase(key);
      }
      return fail(pid.error().to_string());
    }
    {
      std::lock_guard lock(mu_);
      if (auto it = children_.find(key); it != children_.end()) it->second.pid = *pid;
      if (auto* m = mesh_by_serial(serial)) m->pids.back() = *pid;
    }
    started.push_back(key);
    answer.procs.push_back({key, static_cast<int64_t>(*pid)});
  }
  {
    std::lock_guard lock(mu_);
    std::erase_if(meshes_, [&](Mesh& m) {
      if (m.serial != serial) return false;
      m.spawning = false;
      return m.name.empty() && m.all_exited();
    });
  }
  send(to, answer.encode());
}

// A child of this worker exited: its mesh records how (a later controller that finds the
// mesh learns it), and the controller it belongs to is told, if this worker serves it.
void HostAgent::child_exited(const std::string& key, const host::ExitStatus& s) {
  std::optional<channel::Address> to;
  uint64_t host_mesh = 0, host_index = 0;
  {
    std::lock_guard lock(mu_);
    children_.erase(key);
    std::string owner;
    for (auto it = meshes_.begin(); it != meshes_.end(); ++it) {
      auto k = std::find(it->keys.begin(), it->keys.end(), key);
      if (k == it->keys.end()) continue;
      it->exits[k - it->keys.begin()] = s.to_string();
      owner = it->controller;
      if (it->name.empty() && !it->spawning && it->all_exited()) meshes_.erase(it);
      break;
    }
    if (controller_ && controller_key_ == owner) {
      to = controller_;
      host_mesh = host_mesh_;
      host_index = host_index_;
    }
  }
  if (!to) return;  // its controller is gone; the mesh record keeps the news
  send(*to, proto::HostProcExit{key, host_mesh, host_index, static_cast<int64_t>(s.pid),
                                s.signaled, s.code}
                .encode());
}

void HostAgent::read_output(int i) {
  out_->reader[i]->async_read_some(asio::buffer(out_->buf[i]),
                                   [this, i](std::error_code ec, size_t n) {
                                     if (ec) return;  // the runtime stops
                                     forward_output(i + 1, std::string(out_->buf[i].data(), n));
                                     read_output(i);
                                   });
}

// To the controller served now, or to this process's own fd (through the writer thread,
// HA-12) when there is none.
void HostAgent::forward_output(int fd, std::string data) {
  std::optional<channel::Address> to;
  {
    std::lock_guard lock(mu_);
    to = controller_;
  }
  if (to) {
    send(*to, proto::HostOutput{std::move(data), fd}.encode());
  } else {
    output_.write(fd, std::move(data));
  }
}

// Serves no controller from now on. A worker that is not persistent kills every proc; so
// does a persistent one told to `stop` them (the controller shut its hosts down).
void HostAgent::release(const std::string& why, bool stop) {
  std::vector<pid_t> pids;
  {
    std::lock_guard lock(mu_);
    if (!controller_) return;
    if (persistent_ && !stop) {
      spdlog::warn("podium worker: controller {} {}; keeping its {} procs for the next one "
                   "(persistent)",
                   controller_key_, why, children_.size());
      controller_.reset();
      controller_key_.clear();
      return;
    }
    spdlog::warn("podium worker: controller {} {}; killing its {} procs", controller_key_, why,
                 children_.size());
    for (auto& [key, child] : children_) {
      if (child.pid > 0) pids.push_back(child.pid);
    }
    controller_.reset();
    controller_key_.clear();
  }
  for (pid_t pid : pids) (void)spawner_.kill_group(pid, SIGKILL);
}

// HA-11: only the controller served kills.
void HostAgent::on_kill(const actor::SystemHeader& h, const std::string& sender) {
  auto m = proto::HostKill::decode(h);
  if (!m) return refuse(h.op, sender, m.error().message);
  if (auto why = not_controller(sender)) {
    return refuse(h.op, sender, "kill of " + m->proc_key + ": " + *why);
  }
  pid_t pid = -1;
  {
    std::lock_guard lock(mu_);
    if (auto it = children_.find(m->proc_key); it != children_.end()) pid = it->second.pid;
  }
  if (pid <= 0) {
    spdlog::debug("podium worker: host_kill of {}: no such proc here (it ended)", m->proc_key);
    return;
  }
  if (!spawner_.kill_group(pid, m->signal)) {
    spdlog::debug("podium worker: host_kill of {} (pid {}): it is gone already", m->proc_key, pid);
  }
}

// The controller served now takes over the proc mesh of that name (HA-7).
void HostAgent::on_lookup(const actor::SystemHeader& h, const std::string& sender) {
  auto m = proto::HostLookup::decode(h);
  proto::HostFound found{h.numbers.empty() ? 0 : h.numbers[0], "", "", 0, {}};
  if (!m) {
    refuse(h.op, sender, m.error().message);
    if (h.numbers.empty()) return;
    found.error = where() + ": " + m.error().message;
    return answer(sender, found.encode());
  }
  if (auto why = not_controller(sender)) {
    refuse(h.op, sender, *why);
    found.error = where() + " does not serve this controller";
    return answer(sender, found.encode());
  }
  {
    std::lock_guard lock(mu_);
    Mesh* mesh = nullptr;
    std::string names;
    for (auto& x : meshes_) {
      if (x.name.empty()) continue;
      if (x.name == m->name) mesh = &x;
      names += (names.empty() ? "'" : ", '") + x.name + "'";
    }
    if (!mesh) {
      found.error = where() + " keeps no proc mesh named '" + m->name + "' (" +
                    (names.empty() ? std::string("it keeps no named proc mesh")
                                   : "it keeps " + names) +
                    ")";
    } else if (mesh->all_exited()) {
      found.error = where() + " keeps proc mesh '" + m->name + "' no more: its " +
                    std::to_string(mesh->keys.size()) + " procs have all ended (rank " +
                    std::to_string(mesh->first) + " " + mesh->exits.front() + ")";
    } else {
      mesh->controller = m->controller.to_string();
      found.extent = mesh->extent;
      found.first = mesh->first;
      for (size_t i = 0; i < mesh->keys.size(); ++i) {
        found.procs.push_back({mesh->keys[i], mesh->exits[i], mesh->pids[i]});
      }
    }
  }
  send(m->controller, found.encode());
}

// The controller leaves (stop 0: a persistent worker keeps its procs), or shut this host
// down (stop 1: every proc ends). Answered by host_spawned with no error and no procs.
void HostAgent::on_detach(const actor::SystemHeader& h, const std::string& sender) {
  auto m = proto::HostDetach::decode(h);
  if (!m) {
    refuse(h.op, sender, m.error().message);
    if (!h.numbers.empty()) {
      answer(sender, proto::HostSpawned{h.numbers[0], where() + ": " + m.error().message, {}}
                         .encode());
    }
    return;
  }
  if (auto why = not_controller(sender)) {
    // HA-10: a detach behind an attach this worker refused, or one that crossed a release,
    // is expected: answered (nobody may wait for it) and logged at debug level only.
    spdlog::debug("podium worker: host_detach from {} ignored: {}", sender, *why);
    return answer(sender, proto::HostSpawned{m->request, where() + ": " + *why, {}}.encode());
  }
  release(m->stop ? "shut this host down" : "detached", m->stop);
  send(m->controller, proto::HostSpawned{m->request, "", {}}.encode());
  if (m->stop && (end_on_shutdown_ || !persistent_)) {  // HA-16; until_shutdown: persistent too
    std::lock_guard lock(mu_);
    if (stopped_) return;
    spdlog::info("podium worker: {} shut this host down; exiting", m->controller.to_string());
    exit_timer_->expires_at(base::now_of(clock_) + kExitAfterShutdown);
    exit_timer_->async_wait([this](std::error_code ec) {
      if (!ec) proc_.request_exit();
    });
  }
}

// Heartbeats to the controller served every lost-after / 6, and HA-5's verdict, timed to
// fall exactly when the controller has been silent for lost-after.
void HostAgent::tick() {
  std::optional<channel::Address> to;
  proto::WorkerBeat beat;
  bool lost = false;
  std::chrono::milliseconds lost_after{3000};
  auto now = base::now_of(clock_);
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    lost_after = lost_after_;
    if (controller_) {
      if (now - last_heard_ >= lost_after_) {
        lost = true;
      } else {
        to = controller_;
        beat = {host_mesh_, host_index_};
      }
    }
  }
  if (lost) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "was not heard from for %.1f s", lost_after.count() / 1000.0);
    release(buf);  // HA-5
  }
  if (to) send(*to, beat.encode());
  std::lock_guard lock(mu_);
  if (stopped_) return;
  auto wake = now + std::max<base::Clock::duration>(std::chrono::milliseconds(20), lost_after / 6);
  if (controller_) wake = std::min(wake, last_heard_ + lost_after_);
  timer_->expires_at(wake);
  timer_->async_wait([this](std::error_code ec) {
    if (!ec) tick();
  });
}

}  // namespace podium::mesh
