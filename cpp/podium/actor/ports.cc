#include "podium/actor/ports.h"

#include <utility>

namespace podium::actor {

uint64_t PortTable::open(Handler handler, bool once) {
  uint64_t port = next_.fetch_add(1, std::memory_order_relaxed);
  std::shared_ptr<Handler> dropped;  // destroyed outside the lock when closed (AC-13)
  std::lock_guard lock(mu_);
  if (closed_) {
    dropped = std::make_shared<Handler>(std::move(handler));
  } else {
    ports_.emplace(port, Entry{std::make_shared<Handler>(std::move(handler)), once});
  }
  return port;
}

void PortTable::close(uint64_t port) {
  std::shared_ptr<Handler> dropped;  // destroyed outside the lock
  std::lock_guard lock(mu_);
  auto it = ports_.find(port);
  if (it == ports_.end()) return;
  dropped = std::move(it->second.handler);
  ports_.erase(it);
}

std::shared_ptr<PortTable::Handler> PortTable::take(uint64_t port) {
  std::lock_guard lock(mu_);
  auto it = ports_.find(port);
  if (it == ports_.end()) return nullptr;
  auto handler = it->second.handler;
  if (it->second.once) ports_.erase(it);
  return handler;
}

void PortTable::close_all() {
  std::unordered_map<uint64_t, Entry> ports;
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    ports.swap(ports_);
  }
}

}  // namespace podium::actor
