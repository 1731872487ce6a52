// The owner's side of podium._core.data: the buffers this process owns, the system
// operations through which readers ask it to check a token ("rdma_check", DA-7, DA-27) and
// holders drop a buffer ("rdma_drop", DA-8), the registrations held for leases (DA-27), and
// the revocation of those leases a drop asks of their readers ("rdma_revoke", DA-42).
// Threads: the system operations run on the root proc's loop threads and touch only the
// BufferTable (a leaf lock) and Proc::send_reply.
#include <asio/steady_timer.hpp>
#include <algorithm>
#include <atomic>
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

// Registrations held for leases (DA-27) until their timer fires or their lessees confirmed
// a revocation (DA-42), whichever comes first. Like table(), this set is never destroyed: a
// timer that never fires (the process exits) leaves them here, as live buffers stay in the
// table, instead of releasing them while the engine shuts down.
struct Pending {
  std::shared_ptr<data::BufferTable::Retired> retired;
  std::function<void()> then;
};
struct Held {
  std::mutex mu;
  uint64_t next = 1;  // keys are never reused: a late timer finds nothing
  std::unordered_map<uint64_t, Pending> held;
};
Held& held() {
  static auto* h = new Held();
  return *h;
}

// Releases the registrations held under `key` and runs their `then`, once: the first of the
// timer and an early release does it, the other finds nothing.
void complete(uint64_t key) {
  Pending p;
  {
    std::lock_guard lock(held().mu);
    auto it = held().held.find(key);
    if (it == held().held.end()) return;
    p = std::move(it->second);
    held().held.erase(it);
  }
  p.retired.reset();  // unregisters, outside the lock
  if (p.then) p.then();
}
}  // namespace

std::function<void()> release_at(data::BufferTable::Retired retired, std::function<void()> then) {
  if (retired.until <= Clock::now() || mesh::Runtime::current() == nullptr) {
    retired.regs.clear();
    if (then) then();
    return {};
  }
  ++g_delayed_releases;
  auto until = retired.until;
  uint64_t key = 0;
  {
    std::lock_guard lock(held().mu);
    key = held().next++;
    held().held.emplace(
        key, Pending{std::make_shared<data::BufferTable::Retired>(std::move(retired)),
                     std::move(then)});
  }
  auto timer = std::make_shared<asio::steady_timer>(mesh::Runtime::get().proc().io());
  timer->expires_at(until);
  timer->async_wait([timer, key](std::error_code ec) {
    if (ec) return;  // the loop stops: the registrations stay held until the process exits
    complete(key);
  });
  return [key] { complete(key); };
}

namespace {

// DA-42: asks each lessee of each buffer to revoke its leases of it; once all confirmed,
// `release_now` releases the registrations (and answers the drop). A lessee that does not
// confirm (its proc ended, the message failed) leaves them to the leases' timer.
void revoke_leases(const std::vector<data::BufferTable::Lessees>& lessees,
                   std::function<void()> release_now) {
  struct Count {
    std::atomic<size_t> left{0};
    std::atomic<bool> all_ok{true};
    std::vector<uint64_t> ids;
  };
  auto count = std::make_shared<Count>();
  size_t asks = 0;
  for (const auto& l : lessees) {
    count->ids.push_back(l.id);
    asks += l.procs.size();
  }
  count->left = asks;
  std::string me = mesh::Runtime::get().proc().id().to_string();
  for (const auto& l : lessees) {
    for (const auto& who : l.procs) {
      ask_proc(who, actor::SystemHeader{"rdma_revoke", {me}, {l.id}},
               [count, release_now](const Status& st, uint64_t) {
                 if (!st) {
                   ++g_revocations_unconfirmed;
                   count->all_ok = false;
                 }
                 if (count->left.fetch_sub(1) != 1 || !count->all_ok.load()) return;
                 ++g_released_on_revocation;
                 for (uint64_t id : count->ids) table().revoked(id);
                 release_now();
               });
    }
  }
}

}  // namespace

void retire(data::BufferTable::Retired retired, std::function<void()> then) {
  auto lessees = std::move(retired.lessees);
  bool anonymous = retired.anonymous;
  auto release_now = release_at(std::move(retired), std::move(then));
  if (release_now && !anonymous && !lessees.empty()) {
    revoke_leases(lessees, std::move(release_now));
  }
}

namespace {

// The reader's proc of a check: the proc of its reply port ("" when not known).
std::string grantee_of(std::string_view port) {
  auto id = actor::PortId::parse(port);
  return id ? id->actor.proc.to_string() : std::string();
}

}  // namespace


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
        // DA-42: the reader is a lessee even without a lease, while its checked transfer
        // runs: a drop revokes, and the reader answers once that transfer is done. Should it
        // not answer, the drop waits kCheckedHoldMs (or the lease) for it.
        st = table().check(accesses, std::chrono::milliseconds(granted_ms), Clock::now(), &failed,
                           grantee_of(port), std::chrono::milliseconds(kCheckedHoldMs));
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
      // DA-27: the memory stays registered, and the drop unanswered, until the leases end;
      // DA-42: or until every lessee confirmed their revocation, if sooner.
      // DA-46: and until no request of this process's TCP bulk server moves its bytes.
      uint64_t id = h.numbers[0];
      retire(std::move(*r), [&proc, id, port = std::move(port)] {
        after_bulk_idle(id, [&proc, port] {
          if (!port.empty()) proc.send_reply(port, 0, std::vector<Buffer>{});
        });
      });
    });
  });
}


}  // namespace podium::python::dataplane
