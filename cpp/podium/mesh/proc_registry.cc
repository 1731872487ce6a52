#include "podium/mesh/proc_registry.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>

namespace podium::mesh {

std::chrono::milliseconds dead_record_grace() {
  if (const char* v = std::getenv("PODIUM_DEAD_RECORD_GRACE_MS"); v && *v) {
    char* end = nullptr;
    long long ms = std::strtoll(v, &end, 10);
    if (end && *end == '\0' && ms >= 0) return std::chrono::milliseconds(ms);
  }
  return kDeadRecordGrace;
}

bool ProcRegistry::note_dead(const std::string& key, Error why, Clock::time_point now) {
  auto [it, added] = dead.try_emplace(key, std::move(why));
  if (added) dying_.emplace_back(now, key);
  return added;
}

void ProcRegistry::add_view(const std::shared_ptr<ProcMeshState>& mesh) {
  for (const auto& p : mesh->procs) views_[p.id.to_string()].push_back(mesh);
  view_count_ += mesh->procs.size();
  for (const auto& s : mesh->spawners) by_spawner_[s].push_back(mesh);
  // Amortised O(1) per view: a process that is handed meshes again and again (a mesh passed
  // as an argument of every call) keeps only those still alive.
  if (view_count_ >= 2 * views_after_compact_ + 64) compact_views();
}

void ProcRegistry::compact_views() {
  view_count_ = 0;
  for (auto it = views_.begin(); it != views_.end();) {
    std::erase_if(it->second, [](const auto& w) { return w.expired(); });
    if (it->second.empty()) {
      it = views_.erase(it);
    } else {
      view_count_ += it->second.size();
      ++it;
    }
  }
  views_after_compact_ = view_count_;
  for (auto it = by_spawner_.begin(); it != by_spawner_.end();) {
    std::erase_if(it->second, [](const auto& w) { return w.expired(); });
    it = it->second.empty() ? by_spawner_.erase(it) : std::next(it);
  }
}

std::vector<std::shared_ptr<ProcMeshState>> ProcRegistry::views_spawned_by(
    const std::string& key) const {
  std::vector<std::shared_ptr<ProcMeshState>> out;
  if (auto it = by_spawner_.find(key); it != by_spawner_.end()) {
    for (const auto& w : it->second) {
      if (auto m = w.lock()) out.push_back(std::move(m));
    }
  }
  return out;
}

bool ProcRegistry::addressed(const std::string& key) const {
  if (auto it = by_key.find(key); it != by_key.end() && !it->second.mesh.expired()) return true;
  if (auto it = views_.find(key); it != views_.end()) {
    return std::any_of(it->second.begin(), it->second.end(),
                       [](const auto& w) { return !w.expired(); });
  }
  return false;
}

std::vector<ProcRegistry::Dropped> ProcRegistry::sweep(Clock::time_point now,
                                                        Clock::duration grace) {
  std::vector<Dropped> out;
  std::erase_if(meshes, [](const auto& kv) { return kv.second.expired(); });
  compact_views();
  // Each record is looked at once per sweep: one still addressed goes to the back, with a
  // new grace (so a zero grace cannot loop).
  for (size_t n = dying_.size(); n > 0 && now - dying_.front().first >= grace; --n) {
    std::string key = std::move(dying_.front().second);
    dying_.pop_front();
    if (addressed(key)) {
      dying_.emplace_back(now, std::move(key));
      continue;
    }
    Dropped d{key, nullptr, 0};
    if (auto it = by_key.find(key); it != by_key.end()) {
      d.host = std::move(it->second.host);
      d.host_index = it->second.host_index;
      by_key.erase(it);
    }
    dead.erase(key);
    reservations.erase(key);
    if (auto v = views_.find(key); v != views_.end()) {
      view_count_ -= v->second.size();
      views_.erase(v);
    }
    out.push_back(std::move(d));
  }
  return out;
}

std::optional<ProcRegistry::Clock::time_point> ProcRegistry::next_sweep(
    Clock::duration grace) const {
  if (dying_.empty()) return std::nullopt;
  return dying_.front().first + grace;
}

}  // namespace podium::mesh
