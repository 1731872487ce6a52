// The owner's side of podium._core.data: the buffers this process owns, the system
// operations through which readers ask it to check a token ("rdma_check", DA-7, DA-27) and
// holders drop a buffer ("rdma_drop", DA-8), and the registrations held for leases (DA-27).
// Threads: the system operations run on the root proc's loop threads and touch only the
// BufferTable (a leaf lock) and Proc::send_reply.
#include <asio/steady_timer.hpp>
#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "data_internal.h"
#include "podium/actor/message.h"
#include "podium/actor/proc.h"
#include "podium/mesh/runtime.h"

namespace podium::python::dataplane {

data::BufferTable& table() {
  static auto* t = new data::BufferTable();  // lives as long as the process (its loop uses it)
  return *t;
}

namespace {

// Registrations held for leases (DA-27) until their timer fires. Like table(), this set is
// never destroyed: a timer that never fires (the process exits) leaves them here, as live
// buffers stay in the table, instead of releasing them while the engine shuts down.
struct Held {
  std::mutex mu;
  std::unordered_map<const void*, std::shared_ptr<data::BufferTable::Retired>> held;
};
Held& held() {
  static auto* h = new Held();
  return *h;
}
}  // namespace

// Releases `retired` at `until` on the proc's loop (DA-27), then runs `then`; both at once
// when that time has passed.
void release_at(data::BufferTable::Retired retired, std::function<void()> then) {
  if (retired.until <= Clock::now() || mesh::Runtime::current() == nullptr) {
    retired.regs.clear();
    if (then) then();
    return;
  }
  ++g_delayed_releases;
  auto until = retired.until;
  auto keep = std::make_shared<data::BufferTable::Retired>(std::move(retired));
  const void* key = keep.get();
  {
    std::lock_guard lock(held().mu);
    held().held.emplace(key, std::move(keep));
  }
  auto timer = std::make_shared<asio::steady_timer>(mesh::Runtime::get().proc().io());
  timer->expires_at(until);
  timer->async_wait([timer, key, then = std::move(then)](std::error_code ec) {
    if (ec) return;  // the loop stops: the registrations stay held until the process exits
    std::shared_ptr<data::BufferTable::Retired> r;
    {
      std::lock_guard lock(held().mu);
      auto it = held().held.find(key);
      if (it != held().held.end()) {
        r = std::move(it->second);
        held().held.erase(it);
      }
    }
    r.reset();  // unregisters, outside the lock
    if (then) then();
  });
}


namespace {
std::once_flag g_handlers_once;
}  // namespace

// The owner's system operations (see the file comment). "rdma_check": args = tokens,
// numbers = [id, write] per operation; the error of operation i is tagged with i.
// "rdma_drop": args = [token], numbers = [id].
void install_handlers() {
  std::call_once(g_handlers_once, [] {
    auto& proc = mesh::Runtime::get().proc();
    proc.on_system("rdma_check", [&proc](const actor::SystemHeader& h, wire::Envelope&& env) {
      ++g_checks_answered;
      std::string port(actor::reply_port_of(env));
      size_t n = h.args.size();
      // A trailing number asks for a lease of that many ms (DA-27, DA-28).
      bool asks_lease = h.numbers.size() == 2 * n + 1;
      uint64_t granted_ms = 0;
      Status st;
      if (!asks_lease && h.numbers.size() != 2 * n) {
        st = std::unexpected(make_error(data::DataErrc::kInvalidArgument,
                                        "malformed rdma_check from " + env.sender));
      } else {
        std::vector<data::BufferTable::Access> accesses(n);
        for (size_t i = 0; i < n; ++i) {
          accesses[i] = {h.numbers[2 * i], h.args[i], h.numbers[2 * i + 1] != 0};
        }
        if (asks_lease) {
          // At most 30 s, whatever the settings: a drop waits for the leases (DA-27), and
          // podium.rdma gives a drop 60 s.
          int64_t own = std::clamp<int64_t>(lease_settings().ms.load(), 0, kMaxLeaseMs);
          granted_ms = std::min<uint64_t>(h.numbers[2 * n], static_cast<uint64_t>(own));
        }
        size_t failed = 0;
        st = table().check(accesses, std::chrono::milliseconds(granted_ms), Clock::now(), &failed);
        if (!st) st = std::unexpected(tagged(failed, st.error()));
      }
      if (port.empty()) return;
      if (st) {
        std::vector<Buffer> parts;
        if (asks_lease) parts.push_back(Buffer::copy_of(std::to_string(granted_ms)));
        proc.send_reply(port, 0, std::move(parts));
      } else {
        proc.send_reply(port, 0, std::unexpected(st.error()));
      }
    });
    proc.on_system("rdma_drop", [&proc](const actor::SystemHeader& h, wire::Envelope&& env) {
      std::string port(actor::reply_port_of(env));
      Result<data::BufferTable::Retired> r;
      if (h.numbers.size() != 1 || h.args.size() != 1) {
        r = std::unexpected(make_error(data::DataErrc::kInvalidArgument,
                                       "malformed rdma_drop from " + env.sender));
      } else {
        r = table().drop(h.numbers[0], h.args[0]);
      }
      if (!r) {
        if (!port.empty()) proc.send_reply(port, 0, std::unexpected(r.error()));
        return;
      }
      // DA-27: the memory stays registered, and the drop unanswered, until the leases end.
      release_at(std::move(*r), [&proc, port = std::move(port)] {
        if (!port.empty()) proc.send_reply(port, 0, std::vector<Buffer>{});
      });
    });
  });
}


}  // namespace podium::python::dataplane
