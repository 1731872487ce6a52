// podium::actor::PortTable — the ports a Proc opened under its system actor.
//
// A port is a handler that runs, on the delivering thread, for each message to
// "<proc>#proc[0]:<n>" (a reply port, a PortReceiver). A once-port is closed by its first
// message.
//
// Threads: every member is thread-safe; handlers run outside the lock.
// Invariants: AC-13 (stated in docs/actor.md): close_all() drops every handler while the
// program still runs, and a port opened after it is never registered, so a handler that owns
// a reply's promise abandons it and its waiter hears kCancelled.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "podium/wire/envelope.h"

namespace podium::actor {

class PortTable {
 public:
  using Handler = std::function<void(wire::Envelope&&)>;

  // Registers `handler` under a new number (not registered once closed: AC-13).
  uint64_t open(Handler handler, bool once);
  void close(uint64_t port);
  // The handler of `port` (taken out when it is a once-port), or null when none.
  std::shared_ptr<Handler> take(uint64_t port);
  // AC-13: drops every handler, and refuses later opens.
  void close_all();

 private:
  struct Entry {
    std::shared_ptr<Handler> handler;
    bool once = false;
  };
  std::mutex mu_;  // guards ports_, closed_
  std::unordered_map<uint64_t, Entry> ports_;
  bool closed_ = false;
  std::atomic<uint64_t> next_{1};
};

}  // namespace podium::actor
