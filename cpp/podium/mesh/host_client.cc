// The controller side of the host-agent protocol (host_client.h; the invariants are stated
// in host_agent.h): attach, heartbeats and lost-host verdicts, spawns and lookups on
// attached hosts, their shutdown, and the detach on exit.
#include "podium/mesh/host_client.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <asio/post.hpp>
#include <cstdio>
#include <optional>
#include <utility>

#include "podium/actor/message.h"
#include "podium/channel/probe.h"
#include "podium/mesh/host_protocol.h"
#include "podium/mesh/job_config.h"
#include "podium/mesh/runtime_impl.h"
#include "podium/ndslice/codec.h"

namespace podium::mesh {

namespace {

// "vm (tcp:10.0.0.2:7000)", or the worker's address before it attached.
std::string host_title(const HostState& host) {
  std::string worker = host.worker.to_string();
  return host.hostname.empty() ? worker : host.hostname + " (" + worker + ")";
}

std::string secs(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", ms.count() / 1000.0);
  return buf;
}

}  // namespace

// ---- HostTable ----

void HostTable::add(const std::shared_ptr<HostMeshState>& hm,
                    const std::vector<channel::Address>& workers, Clock::time_point now) {
  hm->id = next_mesh++;
  meshes[hm->id] = hm;
  for (size_t i = 0; i < workers.size(); ++i) by_worker[workers[i].to_string()] = HostRef{hm, i};
  heard[hm.get()].assign(workers.size(), now);
}

std::pair<uint64_t, actor::Future<HostTable::Answer>> HostTable::new_request() {
  uint64_t req = next_request++;
  auto p = std::make_shared<actor::Promise<Answer>>();
  requests[req] = p;
  return {req, p->future()};
}

size_t HostTable::prune(Clock::time_point now, Clock::duration grace) {
  std::vector<uint64_t> gone;
  for (auto& [id, hm] : meshes) {
    bool all_failed = true;
    {
      std::lock_guard lock(hm->mu);
      for (const auto& h : hm->hosts) all_failed = all_failed && h.failure.has_value();
    }
    if (!all_failed) {
      done_since.erase(id);
      continue;
    }
    auto [it, fresh] = done_since.try_emplace(id, now);
    if (!fresh && now - it->second >= grace) gone.push_back(id);
  }
  for (uint64_t id : gone) {
    auto hm = meshes[id];
    meshes.erase(id);
    done_since.erase(id);
    heard.erase(hm.get());
    std::erase_if(by_worker, [&](const auto& kv) { return kv.second.mesh == hm; });
  }
  return gone.size();
}

// ---- messages ----

void Runtime::Impl::send_to(const channel::Address& to, actor::SystemHeader h) {
  proc->send(to, actor::system_message(proc->id(), actor::ProcId{to}, h));
}

void Runtime::Impl::kill_remote(const std::shared_ptr<HostMeshState>& host, size_t index,
                                const std::string& key, int sig) {
  send_to(host->hosts[index].worker, proto::HostKill{key, sig}.encode());
}

// The host (mesh, index) of a worker's message; it was heard from now. Null when unknown.
std::shared_ptr<HostMeshState> Runtime::Impl::host_of(uint64_t mesh, uint64_t index) {
  std::lock_guard lock(mu);
  auto it = hosts.meshes.find(mesh);
  if (it == hosts.meshes.end() || index >= it->second->hosts.size()) return nullptr;
  hosts.heard[it->second.get()][index] = now();
  return it->second;
}

void Runtime::Impl::on_host_attached(const actor::SystemHeader& h, const std::string& sender) {
  auto m = proto::HostAttached::decode(h);
  if (!m) return malformed(h.op, sender, m.error());
  auto hm = host_of(m->host_mesh, m->host_index);
  if (!hm) {
    spdlog::debug("podium: host_attached from {} for host mesh {}, which is gone", sender,
                  m->host_mesh);
    return;
  }
  size_t index = m->host_index;
  if (!m->refusal.empty()) return host_failed(hm, index, m->refusal, MeshErrc::kHostRefused);
  bool all = false;
  bool given_up = false;
  {
    std::lock_guard lock(hm->mu);
    auto& host = hm->hosts[index];
    if (host.attached) return;
    given_up = host.failure.has_value();
    if (!given_up) {
      host.attached = true;
      host.hostname = m->hostname;
      all = ++hm->attached_count == hm->hosts.size();
    }
  }
  if (given_up) {
    // HA-10: this controller gave up on the attach (it timed out); the worker must not stay
    // bound to it. host_tick sent a detach when it gave up; this one covers an answer that
    // crossed it.
    release_worker(hm->hosts[index].worker);
    return;
  }
  spdlog::debug("podium: attached host {} ({})", m->hostname, hm->hosts[index].worker.to_string());
  if (all) hm->initialized_promise.set({});
}

// The request `req` a worker's answer completes, taken out of the table; null when unknown.
std::shared_ptr<actor::Promise<HostTable::Answer>> Runtime::Impl::take_request(uint64_t req) {
  std::lock_guard lock(mu);
  auto it = hosts.requests.find(req);
  if (it == hosts.requests.end()) return nullptr;
  auto p = std::move(it->second);
  hosts.requests.erase(it);
  return p;
}

void Runtime::Impl::forget_request(uint64_t req) {
  std::lock_guard lock(mu);
  hosts.requests.erase(req);
}

namespace {

// The answer `h` and the request it answers, when there is one to fill: a malformed answer
// fails its request when that much is readable (else it is logged with its reason), a
// refusal fails the request, and one that nobody waits for (a detach given up on, HA-10, or
// an answer after its request timed out) is dropped with a debug line.
template <class M>
std::optional<std::pair<M, std::shared_ptr<actor::Promise<HostTable::Answer>>>> open_answer(
    Runtime::Impl& impl, const actor::SystemHeader& h, const std::string& sender) {
  auto m = M::decode(h);
  if (!m) {
    if (auto p = h.numbers.empty() ? nullptr : impl.take_request(h.numbers[0])) {
      p->set(std::unexpected(m.error()));
    } else {
      impl.malformed(h.op, sender, m.error());
    }
    return std::nullopt;
  }
  auto p = impl.take_request(m->request);
  if (!p) {
    spdlog::debug("podium: {} from {} for request {}, which nobody waits for", h.op, sender,
                  m->request);
    return std::nullopt;
  }
  if (!m->error.empty()) {
    p->set(std::unexpected(make_error(MeshErrc::kHostRefused, m->error)));
    return std::nullopt;
  }
  return std::pair{std::move(*m), std::move(p)};
}

}  // namespace

void Runtime::Impl::on_host_spawned(const actor::SystemHeader& h, const std::string& sender) {
  auto answer = open_answer<proto::HostSpawned>(*this, h, sender);
  if (!answer) return;
  auto& [m, p] = *answer;
  HostTable::Answer a;
  for (auto& proc : m.procs) {
    a.keys.push_back(std::move(proc.key));
    a.pids.push_back(proc.pid);
  }
  p->set(std::move(a));
}

void Runtime::Impl::on_host_found(const actor::SystemHeader& h, const std::string& sender) {
  auto answer = open_answer<proto::HostFound>(*this, h, sender);
  if (!answer) return;
  auto& [m, p] = *answer;
  HostTable::Answer a;
  a.extent = std::move(m.extent);
  a.first = m.first;
  for (auto& proc : m.procs) {
    a.keys.push_back(std::move(proc.key));
    a.exits.push_back(std::move(proc.exit));
    a.pids.push_back(proc.pid);
  }
  p->set(std::move(a));
}

void Runtime::Impl::on_host_proc_exit(const actor::SystemHeader& h, const std::string& sender) {
  auto m = proto::HostProcExit::decode(h);
  if (!m) return malformed(h.op, sender, m.error());
  if (!host_of(m->host_mesh, m->host_index)) {
    spdlog::debug("podium: host_proc_exit of {} from {} for host mesh {}, which is gone",
                  m->proc_key, sender, m->host_mesh);
    return;
  }
  host::ExitStatus st;
  st.pid = static_cast<pid_t>(m->pid);
  st.signaled = m->signaled;
  st.code = m->code;
  on_exit(m->proc_key, st);
}

// What procs on attached hosts print (their lines carry the actor's prefix already): to this
// process's stdout or stderr, through the writer thread (HA-12).
void Runtime::Impl::on_host_output(const actor::SystemHeader& h, const std::string& sender) {
  auto m = proto::HostOutput::decode(h);
  if (!m) return malformed(h.op, sender, m.error());
  output->write(m->fd, std::move(m->data));
}

void Runtime::Impl::on_worker_beat(const actor::SystemHeader& h, const std::string& sender) {
  auto m = proto::WorkerBeat::decode(h);
  if (!m) return malformed(h.op, sender, m.error());
  (void)host_of(m->host_mesh, m->host_index);
}

// The host cannot be used: it refused, did not answer, or was lost. Its procs fail (as if
// they had exited, naming the host), and `initialized` fails if it has not resolved.
void Runtime::Impl::host_failed(const std::shared_ptr<HostMeshState>& hm, size_t index,
                                const std::string& why, MeshErrc code) {
  std::vector<std::string> keys;
  std::string name, worker = hm->hosts[index].worker.to_string();
  bool was_attached = false;
  {
    std::lock_guard lock(hm->mu);
    auto& host = hm->hosts[index];
    if (host.failure) return;
    host.failure = why;
    was_attached = host.attached;
    name = host_title(host);
    keys = host.proc_keys;
  }
  std::string what = was_attached ? "host " + name + " was lost: " + why
                                  : "cannot attach host " + std::to_string(index) + " (" + worker +
                                        "): " + why;
  spdlog::error("podium: {}", what);
  hm->initialized_promise.set(std::unexpected(make_error(code, what)));
  for (const auto& key : keys) {
    int64_t pid = -1;
    {
      std::lock_guard lock(mu);
      auto it = by_key.find(key);
      // Dead, or dead and forgotten since `keys` was copied (ME-11): nothing to end.
      if (dead.contains(key) || it == by_key.end()) continue;
      if (auto m = it->second.mesh.lock()) {
        std::lock_guard mlock(m->mu);
        pid = m->procs[it->second.rank].pid;
      }
    }
    proc_ended(key, pid, 0, -1, "was lost with its host: " + why,
               "its host " + name + " was lost: " + why);
  }
}

// Heartbeats to the attached workers every host_lost_after / 6, and the verdicts on those
// silent for host_lost_after (lost, HA-4) or that never answered the attach within
// attach_timeout (unreachable, HA-3), and HA-13. Runs at the next beat or at the earliest
// verdict due, whichever comes first, so that a verdict falls exactly at its deadline.
void Runtime::Impl::host_tick() {
  auto now = this->now();
  auto period = std::max<base::Clock::duration>(std::chrono::milliseconds(20),
                                                host_lost_after / 6);
  std::vector<std::pair<std::shared_ptr<HostMeshState>, size_t>> lost, unreachable;
  std::vector<channel::Address> beats;
  bool beat_due = false;
  {
    std::lock_guard lock(mu);
    if (shut_down || !host_timer) return;
    beat_due = now >= next_beat;
    if (beat_due) next_beat = now + period;
    auto wake = next_beat;
    hosts.prune(now, dead_grace);
    for (auto& [id, hm] : hosts.meshes) {
      auto& clocks = hosts.heard[hm.get()];
      std::lock_guard mlock(hm->mu);
      for (size_t i = 0; i < hm->hosts.size(); ++i) {
        auto& host = hm->hosts[i];
        if (host.failure) continue;
        auto limit = host.attached ? host_lost_after : attach_timeout;
        if (now - clocks[i] >= limit) {
          (host.attached ? lost : unreachable).emplace_back(hm, i);
          continue;
        }
        wake = std::min(wake, clocks[i] + limit);
        if (host.attached && beat_due) beats.push_back(host.worker);
      }
    }
    // HA-13's grace: a host mesh whose hosts all failed is looked at again when it is over.
    for (auto& [id, since] : hosts.done_since) wake = std::min(wake, since + dead_grace);
    host_timer->expires_at(std::max(wake, now));
    host_timer->async_wait([this](std::error_code ec) {
      if (!ec) host_tick();
    });
  }
  auto beat = proto::ControllerBeat{proc->id().addr}.encode();
  for (auto& addr : beats) send_to(addr, beat);
  for (auto& [hm, i] : unreachable) {
    host_failed(hm, i, "no answer within " + secs(attach_timeout) +
                           " (unreachable, or not a podium worker)",
                MeshErrc::kHostLost);
    release_worker(hm->hosts[i].worker);  // HA-10: an attach given up on is not adopted later
  }
  for (auto& [hm, i] : lost) {
    host_failed(hm, i, "no heartbeat for " + secs(host_lost_after), MeshErrc::kHostLost);
  }
}

// HA-10: tells a worker this controller has given up on attaching it, so that an attach that
// reaches it late is undone rather than adopted. Detach arrives after the attach on the same
// link (CH-1); a worker that never got the attach ignores it. Nobody waits for its answer.
void Runtime::Impl::release_worker(const channel::Address& worker) {
  uint64_t req = 0;
  {
    std::lock_guard lock(mu);
    if (shut_down) return;
    req = hosts.next_request++;
  }
  send_to(worker, proto::HostDetach{proc->id().addr, req, false}.encode());
}

// A message to a worker came back. Before it attached, that is its answer (e.g. the secret
// was refused); after, heartbeats decide.
bool Runtime::Impl::worker_undeliverable(const std::string& addr, const Error& why) {
  HostTable::HostRef ref;
  {
    std::lock_guard lock(mu);
    auto it = hosts.by_worker.find(addr);
    if (it == hosts.by_worker.end()) return false;
    ref = it->second;
  }
  bool attached = false;
  {
    std::lock_guard lock(ref.mesh->mu);
    attached = ref.mesh->hosts[ref.index].attached;
  }
  if (attached) return true;
  std::string reason = why.message;
  if (why.is(channel::ChannelErrc::kAuthFailed) && internal::secret_was_generated()) {
    reason += "; this controller runs on a secret it generated itself, since neither "
              "PODIUM_SECRET_FILE nor PODIUM_SECRET is set: start it with the workers' secret "
              "(docs/security.md)";
  }
  host_failed(ref.mesh, ref.index, reason, MeshErrc::kHostRefused);
  return true;
}

// Tells every attached worker this controller is leaving, and waits (bounded) until each has
// stopped its procs, so that a next controller finds them free.
void Runtime::Impl::detach_hosts() {
  std::vector<std::pair<channel::Address, uint64_t>> detach;
  std::vector<actor::Future<HostTable::Answer>> futures;
  {
    std::lock_guard lock(mu);
    for (auto& [id, hm] : hosts.meshes) {
      std::lock_guard mlock(hm->mu);
      for (size_t i = 0; i < hm->hosts.size(); ++i) {
        if (!hm->hosts[i].attached || hm->hosts[i].failure) continue;
        auto [req, answer] = hosts.new_request();
        futures.push_back(std::move(answer));
        detach.emplace_back(hm->hosts[i].worker, req);
      }
    }
  }
  for (auto& [worker, req] : detach) {
    send_to(worker, proto::HostDetach{proc->id().addr, req, false}.encode());
  }
  // A bounded wait of this thread (as Future::get is): real time, whatever the clock.
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1000);
  for (auto& f : futures) {
    auto left = until - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds(0)) break;
    (void)f.get(left);
  }
  std::lock_guard lock(mu);
  for (auto& [worker, req] : detach) hosts.requests.erase(req);
}

// ---- the Runtime's host calls ----

Result<std::shared_ptr<HostMeshState>> Runtime::attach(std::vector<channel::Address> workers) {
  auto& impl = *impl_;
  auto refuse = [](std::string why) {
    return std::unexpected(make_error(BaseErrc::kInvalidArgument, std::move(why)));
  };
  if (workers.empty()) return refuse("attach: no workers given");
  bool any_tcp = false;
  for (const auto& w : workers) {
    // A worker on a Unix socket (ipc://PATH) is on this host: its procs reach this process
    // however it listens.
    if (w.transport == channel::Transport::kUnix) continue;
    if (w.transport != channel::Transport::kTcp || w.port == 0) {
      return refuse("attach: worker address " + w.to_string() +
                    " is not tcp://HOST:PORT with a port, nor ipc://PATH");
    }
    any_tcp = true;
  }
  if (any_tcp && impl.proc->id().addr.transport != channel::Transport::kTcp) {
    return refuse("attaching workers needs TCP between procs: call enable_transport(\"tcp\") "
                  "before anything starts podium in this process (this process listens on " +
                  impl.proc_key + ")");
  }
  auto hm = std::make_shared<HostMeshState>();
  hm->initialized = hm->initialized_promise.future();
  hm->hosts.resize(workers.size());
  for (size_t i = 0; i < workers.size(); ++i) hm->hosts[i].worker = workers[i];
  {
    std::lock_guard lock(impl.mu);
    if (impl.shut_down) return std::unexpected(impl.shut_down_error());
    for (size_t i = 0; i < workers.size(); ++i) {
      std::string key = workers[i].to_string();
      // A worker serves one host mesh of this controller at a time; one that mesh can no
      // longer use (lost, refused, shut down) can be attached anew.
      if (auto it = impl.hosts.by_worker.find(key); it != impl.hosts.by_worker.end()) {
        std::lock_guard hlock(it->second.mesh->mu);
        if (!it->second.mesh->hosts[it->second.index].failure) {
          return refuse("attach: worker " + key + " is attached already");
        }
      }
      for (size_t j = 0; j < i; ++j) {
        if (workers[j] == workers[i]) return refuse("attach: worker " + key + " is named twice");
      }
    }
    impl.hosts.add(hm, workers, impl.now());
    if (!impl.host_timer) impl.host_timer = std::make_unique<base::Timer>(impl.proc->io(), impl.clock);
  }
  // The first tick starts the heartbeats; a later one times the new hosts' attach verdicts.
  asio::post(impl.proc->io(), [raw = &impl] { raw->host_tick(); });
  for (size_t i = 0; i < workers.size(); ++i) {
    // The host its procs listen on: the one this controller dialled, except for a gateway
    // dialled through a port-forward (GW-1), whose own name for itself is the host part of
    // this client's routed address.
    bool gateway = impl.via && workers[i] == *impl.via;
    impl.send_to(workers[i],
                 proto::HostAttach{impl.proc->id().addr,
                                   gateway ? impl.proc->id().addr.target : workers[i].target,
                                   hm->id, i,
                                   static_cast<uint64_t>(impl.host_lost_after.count())}
                     .encode());
    // HA-17: a worker nothing listens at fails the attach at once, not at the timeout. A
    // client attached through a gateway reaches only the gateway itself (GW-3): the others
    // are judged by the attach timeout.
    if (impl.via && workers[i] != *impl.via) continue;
    int bound_ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        impl.attach_timeout).count());
    channel::probe(impl.proc->io(), workers[i], bound_ms,
                   [raw = &impl, hm, i, w = workers[i]](std::error_code ec) {
                     spdlog::debug("podium: probe of worker {}: {}", w.to_string(),
                                   ec ? ec.message() : std::string("accepted"));
                     if (!channel::nothing_listens(ec)) return;
                     raw->host_failed(hm, i, "attach failed: " + ec.message() +
                                                 " (nothing accepts connections at " +
                                                 w.to_string() + ")",
                                      MeshErrc::kHostLost);
                     raw->release_worker(w);  // HA-10
                   });
  }
  return hm;
}

}  // namespace podium::mesh
