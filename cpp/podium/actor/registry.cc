#include <mutex>
#include <unordered_map>

#include "podium/actor/actor.h"

namespace podium::actor {
namespace {

struct Registry {
  std::mutex mu;  // guards types
  std::unordered_map<std::string, TypeFactory> types;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: static registrars may outlive main
  return *r;
}

}  // namespace

void register_actor_type(std::string name, TypeFactory factory) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  r.types[std::move(name)] = std::move(factory);
}

Result<TypeFactory> find_actor_type(std::string_view name) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.types.find(std::string(name));
  if (it == r.types.end()) {
    return std::unexpected(make_error(ActorErrc::kUnknownActorType,
                                      "no actor type '" + std::string(name) +
                                          "' is registered in this binary (PODIUM_ACTOR)"));
  }
  return it->second;
}

}  // namespace podium::actor
