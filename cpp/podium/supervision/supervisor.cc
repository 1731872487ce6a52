#include "podium/supervision/supervisor.h"

#include <spdlog/spdlog.h>

#include "podium/actor/message.h"
#include "podium/ndslice/point.h"

namespace podium::supervision {

uint64_t Supervisor::add(Spawned mesh) {
  std::lock_guard lock(mu_);
  uint64_t id = next_id_++;
  size_t n = mesh.proc_keys.size();
  meshes_.emplace(id, Entry{std::move(mesh), std::vector<uint8_t>(n, 0)});
  return id;
}

namespace {
// The rank in the spawn region of the actor with index `base`, or npos.
size_t rank_of(const Supervisor::Spawned& m, uint64_t base) {
  for (size_t r = 0; r < m.base_ranks.size(); ++r) {
    if (m.base_ranks[r] == base) return r;
  }
  return std::string::npos;
}
}  // namespace

void Supervisor::stopping(uint64_t id, const std::vector<size_t>& base_ranks) {
  std::lock_guard lock(mu_);
  auto it = meshes_.find(id);
  if (it == meshes_.end()) return;
  bool all = true;
  for (size_t b : base_ranks) {
    size_t r = rank_of(it->second.mesh, b);
    if (r < it->second.done.size()) it->second.done[r] = 1;
  }
  for (uint8_t d : it->second.done) all = all && d;
  if (all) meshes_.erase(it);  // nothing left to fail
}

void Supervisor::actor_failed(uint64_t id, uint64_t base_rank, actor::MeshFailure f) {
  std::string owner;
  {
    std::lock_guard lock(mu_);
    auto it = meshes_.find(id);
    size_t rank = it == meshes_.end() ? std::string::npos : rank_of(it->second.mesh, base_rank);
    if (rank == std::string::npos) {
      // Its mesh was stopped and forgotten, or never spawned from here.
      spdlog::warn("podium: failure of an actor no live mesh here owns: {}", f.report());
      return;
    }
    Entry& e = it->second;
    if (e.done[rank]) return;  // SV-2
    e.done[rank] = 1;
    f.mesh_name = e.mesh.name;
    f.rank = base_rank;
    if (auto p = e.mesh.extent.point_of_rank(base_rank)) f.point = p->to_string();
    owner = e.mesh.owner;
    raised_.insert(f.actor_id);
  }
  dispatch(owner, std::move(f));
}

void Supervisor::proc_exited(const std::string& proc_key, int64_t pid, int32_t signal,
                             int32_t exit_code, const std::string& cause) {
  std::vector<std::pair<std::string, actor::MeshFailure>> events;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, e] : meshes_) {
      for (size_t r = 0; r < e.done.size(); ++r) {
        if (e.done[r] || e.mesh.proc_keys[r] != proc_key) continue;
        e.done[r] = 1;
        actor::MeshFailure f;
        f.kind = actor::MeshFailure::Kind::kProc;
        f.mesh_name = e.mesh.name;
        f.actor_id = e.mesh.actor_ids[r];
        f.rank = e.mesh.base_ranks[r];
        if (auto p = e.mesh.extent.point_of_rank(f.rank)) f.point = p->to_string();
        f.host = r < e.mesh.hosts.size() && !e.mesh.hosts[r].empty() ? e.mesh.hosts[r]
                                                                      : actor::host_name();
        f.pid = pid > 0 ? pid : e.mesh.pids[r];
        f.signal = signal;
        f.exit_code = exit_code;
        f.cause = cause;
        raised_.insert(f.actor_id);
        events.emplace_back(e.mesh.owner, std::move(f));
      }
    }
    // Meshes with no rank left to fail are forgotten.
    std::erase_if(meshes_, [](const auto& kv) {
      for (uint8_t d : kv.second.done) {
        if (!d) return false;
      }
      return true;
    });
  }
  for (auto& [owner, f] : events) dispatch(owner, std::move(f));
}

bool Supervisor::raised(const std::string& actor_id) {
  std::lock_guard lock(mu_);
  return raised_.contains(actor_id);
}

void Supervisor::set_root_handler(RootHandler handler) {
  std::lock_guard lock(mu_);
  root_ = std::move(handler);
}

void Supervisor::dispatch(const std::string& owner, actor::MeshFailure f) {
  if (owner.empty()) {
    RootHandler root;
    {
      std::lock_guard lock(mu_);
      root = root_;
    }
    if (root) {
      root(std::move(f));
    } else {
      spdlog::error("podium: unhandled failure: {}", f.report());
    }
    return;
  }
  wire::Envelope env;
  env.kind = static_cast<uint8_t>(actor::MessageKind::kSupervise);
  env.dest = owner + ":0";
  env.parts.push_back(actor::encode_mesh_failure(f));
  proc_.send(std::move(env));
}

}  // namespace podium::supervision
