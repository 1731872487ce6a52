// podium._core.data: the data plane (cpp/podium/data, docs/data.md) for podium.rdma. This
// file: the reader's side (transfer) and the module's functions; the process's engine and
// lease settings are in data_engine.cc, the owner's system operations in data_owner.cc, the
// reader's windows on shared pages in data_shm.cc.
//
// The owner's side: register_buffer() registers a Python buffer with this process's engine
// and keeps it in the process's BufferTable under an id and a capability token; the first
// call installs the "rdma_check" and "rdma_drop" system operations on this process's root
// proc, through which readers ask the owner to check a token before a transfer, and holders
// drop the buffer. The reader's side: transfer() checks every operation's token with its
// owner over the control plane (one message per owner, failing at once when the runtime
// knows the owner's proc ended, ME-2), then runs the one-sided operations on the engine;
// a check may grant a lease, under which later small transfers skip it (DA-26..DA-28).
// Both return a CoreFuture of one reply: ok, or the error. An error of operation i of a
// transfer starts with "\x1f<i>\x1f", so podium.rdma names that operation's buffer.
//
//   DA-41 A summed read (an operation marked `checksum`: a get into host memory) is summed
//         (word_sum, DA-40) over its local region after the engine completed the transfer,
//         on the thread that completes the engine's future (the data plane's copy or
//         progress thread, or the caller's when it completes at once), and before the
//         outcome is finished; the transfer's ok reply then has one part: every operation's
//         sum (0 for the others), 8 bytes each, little-endian. A transfer with no summed
//         operation replies with no part, as before. A transfer that fails sums nothing.
//         A summed read copied at once (copy_now, DA-43) is summed by that copy, as it
//         copies (cma::copy's sum), and copy_now returns the sum; one the engine copies
//         itself (CMA, shared pages) is summed by its chunks as they are copied (DA-44), and
//         only one through UCX is summed after, here.
//
//   DA-35 Waiting for a transfer's future (CoreFuture::wait) drives the proc's loop only when
//         the transfer is checked and small (at most kCallerCopyBytes): then the owner's reply
//         to the check, which the loop reads, is most of its time. A leased transfer, and a
//         larger one once checked, are completed by the data plane's threads (or by the caller
//         before it waits), so their waiter sleeps on the future and leaves the loop to a
//         thread that waits for a message: a bulk transfer waited for on one thread does not
//         put a hand-off into the round trips of another (issue 19 item 6).
//
//   DA-28 A transfer skips the owners' check only when every operation has a usable lease
//         (lease.h, DA-26) and its bytes in all are at most the lease bound
//         (PODIUM_RDMA_LEASE_MAX_BYTES), so that it surely ends inside the lease; the
//         runtime's knowledge that an owner's proc ended is still consulted first (RD-2);
//         the engine's timeout is clamped to the shortest lease left, so no operation outlives
//         its lease, and a transfer stopped by that clamp (not by its caller's timeout) runs
//         again, checked, within the caller's deadline. A leased transfer that fails forgets
//         its leases. Only a check of such a transfer asks for a lease; the owner grants at
//         most its own lease time, and delays a drop's reply, or an owner stop's release,
//         until the latest lease it granted ended (DA-27), on the proc's loop (a timer).
//
// Threads: any Python thread. The system operations run on the root proc's loop threads and
// touch only the BufferTable (a leaf lock) and Proc::send_reply. No C++ thread takes the GIL:
// a pinned Python buffer is released later under the GIL (common.h).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>

#include <algorithm>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common.h"
#include "data_internal.h"
#include "data_shm.h"
#include "future.h"
#include "podium/actor/message.h"
#include "podium/actor/proc.h"
#include "podium/data/buffer_table.h"
#include "podium/data/checksum.h"
#include "podium/data/engine.h"
#include "podium/data/lease.h"
#include "podium/data/shm.h"
#include "podium/mesh/cast.h"
#include "podium/mesh/runtime.h"
#include "podium/channel/address.h"

namespace podium::python {
namespace {

using namespace dataplane;  // data_internal.h

// The reader's leases (DA-26); like table(), lives as long as the process.
data::LeaseCache& leases() {
  static auto* c = new data::LeaseCache();
  return *c;
}

// Set while transfer() submits on its caller's thread (DA-31): an outcome finished there is
// ready before the caller waits.
thread_local bool t_caller_submits = false;

// The one reply of a data-plane future.
struct Outcome {
  actor::Promise<mesh::Replies> promise;
  std::atomic<bool> finished{false};
  std::shared_ptr<asio::steady_timer> timer;  // set once by bound(), before any finish
  // Cancels the timer of bound() (on the loop, which owns it); a timer that fired already
  // has finished the outcome. Without a timer, the post still wakes the loop: a Python thread
  // that waits for this outcome may be driving the loop (Executor::drive), and would see a
  // completion set by a data thread only at its next event.
  void disarm() {
    if (!timer && t_caller_submits) return;  // its caller has not started waiting yet
    asio::post(mesh::Runtime::get().proc().io(), [t = timer] {
      if (t) t->cancel();
    });
  }
  // AC-4: the first finish wins. `parts`: the ok reply's (DA-41).
  void finish(const Status& st, std::vector<Buffer> parts = {}) {
    if (finished.exchange(true)) return;
    if (st) {
      promise.set(mesh::Replies{mesh::Reply(std::move(parts))});
    } else {
      promise.set(mesh::Replies{mesh::Reply(std::unexpected(st.error()))});
    }
    disarm();  // after the value: a driver the post wakes sees it
  }
};

using Answer = std::function<void(const Status&, uint64_t)>;

}  // namespace

namespace dataplane {
// (data_internal.h) `done` gets the number the reply's first part holds: the lease an owner
// granted (DA-28); the proc's end is known at once when it is dead already (ME-2).
void ask_proc(const std::string& owner, const actor::SystemHeader& h, Answer done) {
  auto& rt = mesh::Runtime::get();
  if (auto dead = rt.proc_dead(owner)) {
    done(std::unexpected(*dead), 0);
    return;
  }
  auto addr = channel::Address::parse(owner);
  if (!addr) {
    done(std::unexpected(make_error(data::DataErrc::kInvalidArgument,
                                    "bad owner address " + owner + ": " + addr.error().message)),
         0);
    return;
  }
  actor::ProcId pid{*addr};
  auto collector = std::make_shared<mesh::Collector>(std::vector<std::string>{owner});
  auto port = rt.proc().open_port(
      [collector](wire::Envelope&& env) { collector->fill(0, mesh::decode_reply(std::move(env)).second); },
      true);
  collector->port = port.port;
  collector->future().on_ready(
      [done = std::move(done), p = port.port](const Result<mesh::Replies>& r) {
        mesh::Runtime::get().proc().close_port(p);
        if (!r) {
          done(std::unexpected(r.error()), 0);
        } else if (auto e = r->first_error()) {
          done(std::unexpected(*e->second), 0);
        } else {
          uint64_t number = 0;
          const auto& parts = (*r)[0];
          if (parts && !parts->empty()) {
            for (char c : parts->front().view()) {
              if (c < '0' || c > '9') break;
              number = number * 10 + static_cast<uint64_t>(c - '0');
            }
          }
          done({}, number);
        }
      });
  wire::Envelope env;
  env.kind = static_cast<uint8_t>(actor::MessageKind::kSystem);
  env.dest = actor::PortId{actor::ActorId{pid, std::string(actor::kSystemActorName), 0}, actor::kMailboxPort}
                 .to_string();
  env.headers.emplace_back(actor::kReplyHeader, port.to_string());
  env.parts.push_back(actor::encode_system_header(h));
  rt.proc().send(pid.addr, std::move(env));
  rt.track(collector, {owner});
}
}  // namespace dataplane

namespace {

// Fails `out` with kTimeout after `timeout` unless it finished before.
// `shown`: the timeout the message names (the caller's), when `timeout` is what is left of it.
void bound(const std::shared_ptr<Outcome>& out, std::chrono::nanoseconds timeout,
           std::string what, std::optional<std::chrono::nanoseconds> shown = std::nullopt) {
  auto timer = std::make_shared<asio::steady_timer>(
      mesh::Runtime::get().proc().io(),
      std::chrono::duration_cast<asio::steady_timer::duration>(timeout));
  if (shown) timeout = *shown;
  std::weak_ptr<Outcome> weak = out;
  out->timer = timer;
  timer->async_wait([timer, weak, what = std::move(what), timeout](std::error_code ec) {
    if (ec) return;
    if (auto o = weak.lock()) {
      o->finish(std::unexpected(make_error(
          data::DataErrc::kTimeout,
          what + " did not finish within " +
              std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()) +
              " ms")));
    }
  });
}

// A region as podium.rdma hands it over: a Python buffer (host memory), or a tensor's as the
// tuple (address, size, tensor, cuda): CUDA memory, whose bytes no Python buffer can export
// (DA-23), or a CPU tensor's, without a NumPy array made per transfer. (address, size,
// tensor) is CUDA memory.
struct Region {
  Buffer pinned;
  data::Memory memory = data::Memory::kHost;
};

Region region_from_python(nb::handle obj, bool writable) {
  if (nb::isinstance<nb::tuple>(obj)) {
    auto t = nb::borrow<nb::tuple>(obj);
    if (t.size() != 3 && t.size() != 4) {
      throw nb::value_error("a tensor region is (address, size, owner[, cuda])");
    }
    bool cuda = t.size() == 3 || nb::cast<bool>(t[3]);
    return Region{pin_foreign_memory(t[2], nb::cast<uintptr_t>(t[0]), nb::cast<size_t>(t[1]),
                                     writable),
                  cuda ? data::Memory::kCuda : data::Memory::kHost};
  }
  return Region{pin_python_buffer(obj, writable), data::Memory::kHost};
}

std::chrono::nanoseconds seconds(double s) {
  return std::chrono::nanoseconds(static_cast<int64_t>(std::max(0.0, s) * 1e9));
}

// One operation as podium.rdma hands it over (see transfer's doc).
using PyOp = std::tuple<bool, std::string, uint64_t, std::string, uint64_t, nb::bytes, nb::bytes,
                        nb::object, size_t, bool, int, bool, nb::object, bool>;

// A transfer, as the checked and the leased paths (DA-28) share it.
struct Plan {
  std::shared_ptr<Outcome> out;
  data::Engine* eng = nullptr;
  std::vector<data::Op> ops;  // copied for each attempt
  struct Key {
    std::string owner;
    uint64_t id = 0;
    std::string token;
    bool write = false;
  };
  std::vector<Key> keys;  // per operation
  // Per owner: the indices of its operations, and the check message.
  std::vector<std::string> owners;
  std::vector<std::vector<size_t>> members;
  std::vector<actor::SystemHeader> checks;
  Clock::time_point deadline;
  std::chrono::nanoseconds timeout{};
  uint64_t lease_ms = 0;  // asked for with each check; 0: none
  std::vector<bool> summed;  // per operation (DA-41)
  bool any_summed = false;
  // DA-44: the summed operations' sums of the attempt running (fresh for each: a late chunk
  // of one that timed out adds to its own).
  std::vector<std::shared_ptr<data::CopySum>> sums_now;
  // The operations of a new attempt, each summed one with a fresh sum.
  std::vector<data::Op> attempt() {
    std::vector<data::Op> out(ops);
    sums_now.assign(ops.size(), nullptr);
    for (size_t i = 0; i < out.size() && any_summed; ++i) {
      if (summed[i]) out[i].sum = sums_now[i] = std::make_shared<data::CopySum>();
    }
    return out;
  }
  // DA-42: the (owner, id) this transfer holds, each once per hold taken; released when the
  // engine is done with the operations (release_holds), or with the plan.
  std::mutex held_mu;
  std::vector<std::pair<std::string, uint64_t>> held;
  ~Plan() { release_holds(); }
  void release_holds() {
    std::vector<std::pair<std::string, uint64_t>> mine;
    {
      std::lock_guard lock(held_mu);
      mine.swap(held);
    }
    for (const auto& [owner, id] : mine) leases().release(owner, id);
  }
};

// The engine completed every operation: sums the summed reads (DA-41), then finishes.
void succeed(const std::shared_ptr<Plan>& p) {
  std::vector<Buffer> parts;
  if (p->any_summed && !p->out->finished.load()) {  // a caller told of a timeout needs none
    std::vector<uint64_t> sums(p->ops.size(), 0);
    for (size_t i = 0; i < sums.size(); ++i) {
      if (!p->summed[i]) continue;
      const auto& copied = p->sums_now[i];  // DA-44: summed as copied, or summed here
      sums[i] = copied && copied->taken ? copied->value.load()
                                        : data::word_sum(p->ops[i].local, p->ops[i].size);
    }
    parts.push_back(Buffer::copy_of(data::encode_sums(sums)));
  }
  p->out->finish({}, std::move(parts));
}

// The error of an owner's check, or of its proc's end, tagged with the operation it names:
// the owner's tag is the index within its group; a proc's end has none.
Error owner_error(const Plan& p, size_t g, const Error& err) {
  const auto& idx = p.members[g];
  const auto& msg = err.message;
  size_t op = idx[0];
  std::string text = msg;
  if (msg.size() > 2 && msg[0] == '\x1f') {
    size_t end = msg.find('\x1f', 1);
    if (end != std::string::npos) {
      size_t k = std::stoul(msg.substr(1, end - 1));
      if (k < idx.size()) op = idx[k];
      text = msg.substr(end + 1);
    }
  }
  Error e = err;
  e.message = text;
  return tagged(op, e);
}

// Asks every owner to check its operations' tokens (and, with lease_ms, for a lease), then
// runs the operations on the engine.
void run_checked(const std::shared_ptr<Plan>& p) {
  ++g_checked;
  auto left = std::max(Clock::duration::zero(), p->deadline - Clock::now());
  bound(p->out, left, "the owners' check of " + std::to_string(p->ops.size()) +
                          " RDMA operation(s)",
        p->timeout);
  struct Gate {
    std::mutex mu;
    size_t left = 0;
    bool failed = false;
  };
  auto gate = std::make_shared<Gate>();
  gate->left = p->owners.size();
  auto sent = Clock::now();  // DA-26: a lease runs from when its check was sent
  for (size_t g = 0; g < p->owners.size(); ++g) {
    ask_proc(p->owners[g], p->checks[g], [p, gate, g, sent](const Status& st, uint64_t granted) {
      // The leases granted, and this transfer's holds on them (DA-42), come before it counts
      // as checked: the engine never starts before every owner's are in place.
      Status why = st;
      if (why) {
        for (size_t i : p->members[g]) {
          const auto& k = p->keys[i];
          if (p->lease_ms > 0) {
            leases().grant(k.owner, k.id, k.write, k.token, sent,
                           std::chrono::milliseconds(std::min(granted, p->lease_ms)));
          }
          // DA-42: the owner counts this process a lessee of the buffer while this transfer
          // runs, leased or not; a drop since its answer revoked it, and it must not run.
          if (!leases().hold_granted(k.owner, k.id, Clock::now())) {
            why = std::unexpected(make_error(
                data::DataErrc::kDropped, "buffer " + std::to_string(k.id) + " of " + k.owner +
                                              " was dropped while this transfer was checked"));
            break;
          }
          std::lock_guard lock(p->held_mu);
          p->held.emplace_back(k.owner, k.id);
        }
      }
      bool run = false, failed_before = false;
      {
        std::lock_guard lock(gate->mu);
        failed_before = gate->failed;
        if (failed_before || !why) {
          gate->failed = true;
        } else {
          run = --gate->left == 0;
        }
      }
      if (failed_before || !why) {
        if (!failed_before) p->out->finish(std::unexpected(owner_error(*p, g, why.error())));
        p->release_holds();  // DA-42: it never runs
        return;
      }
      if (!run) return;  // the last owner's answer starts it
      // DA-5: a transfer whose caller was told it timed out never starts.
      if (p->out->finished.load()) {
        p->release_holds();
        return;
      }
      // From here the engine keeps the deadline, and its timeout also cancels what is in
      // flight (DA-5): the check's timer would only race it.
      p->out->disarm();
      auto left = std::max(Clock::duration::zero(), p->deadline - Clock::now());
      p->eng->submit(p->attempt(), left).on_ready([p](const Result<void>& r) {
        p->release_holds();  // DA-42: the engine is done with the memory
        r ? succeed(p) : p->out->finish(std::unexpected(r.error()));
      });
    });
  }
}

// DA-28: every operation holds a lease with at least `lease_left` left.
void run_leased(const std::shared_ptr<Plan>& p, Clock::duration lease_left) {
  auto& rt = mesh::Runtime::get();
  for (size_t g = 0; g < p->owners.size(); ++g) {
    if (auto dead = rt.proc_dead(p->owners[g])) {  // RD-2, before any lease
      for (const auto& k : p->keys) leases().forget(k.owner, k.id, k.write);
      p->out->finish(std::unexpected(owner_error(*p, g, *dead)));
      return;
    }
  }
  ++g_leased;
  auto user_left = std::max(Clock::duration::zero(), p->deadline - Clock::now());
  bool clamped = lease_left < user_left;
  // DA-31: on the caller's thread (transfer() runs this before it returns).
  t_caller_submits = true;
  p->eng->submit(p->attempt(), std::min(lease_left, user_left), true)
      .on_ready([p, clamped](const Result<void>& r) {
        p->release_holds();  // DA-42: the engine is done with the memory
        if (r) {
          succeed(p);
          return;
        }
        for (const auto& k : p->keys) leases().forget(k.owner, k.id, k.write);
        if (clamped && r.error().is(data::DataErrc::kTimeout) && !p->out->finished.load() &&
            Clock::now() < p->deadline) {
          run_checked(p);  // the lease ran out, not the caller's time: ask the owners
          return;
        }
        p->out->finish(std::unexpected(r.error()));
      });
  t_caller_submits = false;
}

// DA-42: the reader's "rdma_revoke" (args = [owner proc], numbers = [id]), from an owner
// that drops a buffer this process holds a lease of: answered once no transfer of this
// process holds that buffer.
std::once_flag g_revoke_once;
void install_revoke_handler() {
  std::call_once(g_revoke_once, [] {
    auto& proc = mesh::Runtime::get().proc();
    proc.on_system("rdma_revoke", [&proc](const actor::SystemHeader& h, wire::Envelope&& env) {
      std::string port(actor::reply_port_of(env));
      if (h.args.size() != 1 || h.numbers.size() != 1) {
        if (!port.empty()) {
          proc.send_reply(port, 0, std::unexpected(make_error(
                                       data::DataErrc::kInvalidArgument,
                                       "malformed rdma_revoke from " + env.sender)));
        }
        return;
      }
      leases().revoke(h.args[0], h.numbers[0], Clock::now(), [&proc, port = std::move(port)] {
        ++g_revocations_answered;
        if (!port.empty()) proc.send_reply(port, 0, std::vector<Buffer>{});
      });
    });
  });
}

// DA-43: one leased same-host operation that its caller may copy whole (DA-31), copied here at
// once: the lease held (DA-42) and the copy made as run_leased() and submit() would, without a
// plan, an outcome, a future or the engine's transfer; a summed read is summed as it is
// copied (DA-41). Its sum (0 when not summed), or nothing when it does not apply or the copy
// failed: the caller then runs it as a transfer, which reports why.
std::optional<uint64_t> copy_leased_now(const PyOp& py, double timeout_s) {
  const auto& [write, owner, id, token, remote_addr, rkey, worker, local, size, same_host, pid,
               remote_cuda, window, checksum] = py;
  if (!same_host || pid <= 0 || remote_cuda || (checksum && write) || size == 0 ||
      !(timeout_s > 0)) {
    return std::nullopt;  // (no time at all: the engine's timeout says so)
  }
  int64_t lease_ms = lease_settings().ms.load();
  if (lease_ms <= 0 || size > lease_settings().max_bytes.load()) return std::nullopt;
  if (mesh::Runtime::get().proc_dead(owner)) return std::nullopt;  // RD-2: the checked path says so
  if (!leases().hold(owner, id, write, token, Clock::now())) return std::nullopt;
  struct Held {  // DA-42: until the copy is done with the memory, or whatever throws first
    const std::string& owner;
    uint64_t id;
    ~Held() { leases().release(owner, id); }
  } held{owner, id};
  auto [pinned, memory] = region_from_python(local, !write);
  if (memory != data::Memory::kHost || pinned.size() < size) return std::nullopt;
  data::Op op;
  op.kind = write ? data::Op::Kind::kPut : data::Op::Kind::kGet;
  op.remote_addr = remote_addr;
  op.local = const_cast<std::byte*>(pinned.data());
  op.size = size;
  op.same_host = true;
  op.peer_pid = pid;
  if (!window.is_none()) op.window = reader_window(pid, window);  // DA-30
  std::optional<int> copied;
  uint64_t sum = 0;
  {
    nb::gil_scoped_release unlocked;
    copied = engine().copy_now(op, checksum ? &sum : nullptr);  // DA-41: summed as copied
  }
  if (!copied || *copied != 0) return std::nullopt;
  ++g_leased;
  return sum;
}

CoreFuture transfer(const std::vector<PyOp>& py_ops, double timeout_s) {
  release_deferred();
  install_revoke_handler();
  auto p = std::make_shared<Plan>();
  p->eng = &engine();
  p->timeout = seconds(timeout_s);
  p->deadline = Clock::now() + p->timeout;
  p->out = std::make_shared<Outcome>();
  CoreFuture result(p->out->promise.future());
  std::unordered_map<std::string, size_t> owner_index;
  uint64_t total = 0;
  for (size_t i = 0; i < py_ops.size(); ++i) {
    const auto& [write, owner, id, token, remote_addr, rkey, worker, local, size, same_host,
                 pid, remote_cuda, window, checksum] = py_ops[i];
    auto [pinned, memory] = region_from_python(local, !write);
    if (pinned.size() < size) {
      throw nb::value_error("transfer: the local buffer is smaller than the operation");
    }
    if (checksum && (write || memory != data::Memory::kHost)) {  // DA-41
      throw nb::value_error("transfer: only a read into host memory can be summed");
    }
    p->summed.push_back(checksum);
    p->any_summed = p->any_summed || checksum;
    data::Op op;
    op.kind = write ? data::Op::Kind::kPut : data::Op::Kind::kGet;
    op.peer.assign(worker.c_str(), worker.size());
    op.remote_addr = remote_addr;
    op.rkey.assign(rkey.c_str(), rkey.size());
    op.local = const_cast<std::byte*>(pinned.data());
    op.size = size;
    op.keep = std::make_shared<Buffer>(std::move(pinned));
    op.same_host = same_host;
    op.peer_pid = same_host ? pid : 0;
    op.local_memory = memory;  // DA-23
    op.remote_memory = remote_cuda ? data::Memory::kCuda : data::Memory::kHost;
    if (same_host && pid > 0 && !window.is_none()) op.window = reader_window(pid, window);  // DA-30
    p->ops.push_back(std::move(op));
    p->keys.push_back(Plan::Key{owner, id, token, write});
    total += size;
    auto [it, fresh] = owner_index.try_emplace(owner, p->owners.size());
    if (fresh) {
      p->owners.push_back(owner);
      p->members.emplace_back();
      p->checks.push_back(actor::SystemHeader{"rdma_check", {}, {}});
    }
    p->members[it->second].push_back(i);
    p->checks[it->second].args.push_back(token);
    p->checks[it->second].numbers.push_back(id);
    p->checks[it->second].numbers.push_back(write ? 1 : 0);
  }
  if (p->ops.empty()) {
    p->out->finish({});
    return result;
  }
  int64_t lease_ms = lease_settings().ms.load();
  if (lease_ms > 0 && total <= lease_settings().max_bytes.load()) {  // DA-28
    p->lease_ms = static_cast<uint64_t>(lease_ms);
    // Asked with every check, also the one after a lease ran out (run_leased).
    for (auto& c : p->checks) c.numbers.push_back(p->lease_ms);
    auto now = Clock::now();
    std::optional<Clock::duration> shortest;
    for (const auto& k : p->keys) {
      // DA-42: a lease used is held until the engine is done, so that a revocation waits.
      auto left = leases().hold(k.owner, k.id, k.write, k.token, now);
      if (!left) {
        shortest.reset();
        break;
      }
      {
        std::lock_guard lock(p->held_mu);
        p->held.emplace_back(k.owner, k.id);
      }
      shortest = shortest ? std::min(*shortest, *left) : *left;
    }
    if (!shortest) p->release_holds();  // checked instead: its own grant holds
    if (shortest) {
      result.completed_off_loop();  // DA-35
      nb::gil_scoped_release unlocked;
      run_leased(p, *shortest);
      return result;
    }
  }
  if (total > data::kCallerCopyBytes) result.completed_off_loop();  // DA-35
  {
    nb::gil_scoped_release unlocked;
    run_checked(p);
  }
  return result;
}

}  // namespace

void bind_data(nb::module_& m) {
  m.def(
      "copy_now",
      [](const PyOp& op, double timeout_s) {
        release_deferred();
        install_revoke_handler();
        return copy_leased_now(op, timeout_s);
      },
      nb::arg("op"), nb::arg("timeout_s"),
      "DA-43: copies the one operation `op` (as transfer() takes each) at once on this thread "
      "when it is a same-host one under a usable lease that its caller may copy whole (DA-31); "
      "then the sum of a summed read (DA-41), else 0. None when that does not apply or the "
      "copy failed: transfer() it then, which also reports the failure.");
  m.def(
      "available",
      [] {
        if (mesh::Runtime::current() == nullptr) {
          auto [ok, why] = probe();
          return nb::make_tuple(ok, why);
        }
        auto e = instance();
        return nb::make_tuple(e.has_value(), e ? std::string() : e.error().message);
      },
      "(True, '') when this process's data plane (a UCX context and worker) runs, starting "
      "it on first use (DA-1); else (False, why). Before the podium runtime runs: whether "
      "UCX can start (a throwaway engine), since the engine is made for the proc's address "
      "(DA-21).");
  m.def("ucx_version", &data::Engine::ucx_version, "The version of the UCX library in use.");
  m.def(
      "net_devices", [] { return engine().net_devices(); },
      "The network devices UCX may use in this process (DA-21): UCX_NET_DEVICES when set, "
      "else the interface of this process's control-plane address ('lo' on Unix sockets); "
      "'' when neither applies (UCX's default, every device). Starts the data plane.");
  m.def(
      "cuda_supported", [] { return engine().supports(data::Memory::kCuda); },
      "Whether this process's UCX reaches CUDA memory (DA-23). Starts the data plane.");
  m.def("cma_allowed", &data::Engine::cma_allowed,
        "Whether same-host transfers are copied with CMA (DA-10; PODIUM_RDMA_CMA=0: never).");
  m.def(
      "worker_address", [] { return nb::bytes(engine().address().data(), engine().address().size()); },
      "This process's UCX worker address (what readers' endpoints are made from).");
  m.def(
      "register_buffer",
      [](nb::handle obj, const std::string& owner, bool share) {
        release_deferred();
        install_handlers();
        bool writable = true;
        Region region;
        try {
          region = region_from_python(obj, true);
        } catch (nb::python_error&) {
          writable = false;
          region = region_from_python(obj, false);
        }
        const std::byte* data = region.pinned.data();
        size_t size = region.pinned.size();
        if (size == 0) throw nb::value_error("cannot register an empty buffer");
        auto keep = std::make_shared<Buffer>(std::move(region.pinned));
        Result<std::shared_ptr<data::Registration>> registered;
        {
          nb::gil_scoped_release unlocked;  // DA-29 may copy the region into shared pages
          registered = engine().register_memory(data, size, keep, region.memory, share);
        }
        auto reg = unwrap(std::move(registered));
        std::string rkey = reg->rkey();
        uint64_t addr = reg->addr();
        auto win = reg->window();
        auto added = unwrap(table().add(std::move(reg), owner, writable));
        const auto& w = engine().address();
        nb::object window = win.valid() ? nb::object(nb::make_tuple(win.fd, win.ino, win.dev,
                                                                    win.begin, win.end))
                                        : nb::none();
        return nb::make_tuple(added.id, added.token, addr, size, nb::bytes(rkey.data(), rkey.size()),
                              nb::bytes(w.data(), w.size()), writable, window);
      },
      nb::arg("obj"), nb::arg("owner"), nb::arg("share") = true,
      "Registers the C-contiguous buffer `obj` (or a tensor's region (address, size, tensor"
      "[, cuda]), DA-23) for `owner` (an actor id); returns (id, token, "
      "addr, size, rkey, worker_address, writable, window): window is (fd, ino, dev, begin, end) "
      "of its shared pages (DA-29), or None. share=False: its pages are not moved into shared "
      "pages (DA-38). The buffer stays pinned and registered until drop or release_owner "
      "(DA-8).");
  m.def(
      "drop",
      [](const std::string& owner, uint64_t id, const std::string& token, double timeout_s) {
        release_deferred();
        auto out = std::make_shared<Outcome>();
        CoreFuture result(out->promise.future());
        nb::gil_scoped_release unlocked;
        bound(out, seconds(timeout_s), "the drop of RDMA buffer " + std::to_string(id));
        leases().forget(owner, id, false);
        leases().forget(owner, id, true);
        ask_proc(owner, actor::SystemHeader{"rdma_drop", {token}, {id}},
                  [out](const Status& st, uint64_t) { out->finish(st); });
        return result;
      },
      nb::arg("owner"), nb::arg("id"), nb::arg("token"), nb::arg("timeout_s"),
      "Asks the proc `owner` to drop its buffer `id` (its registration is released, DA-8, once "
      "every reader it leased the buffer to confirmed a revocation, DA-42, or once those leases "
      "ended, DA-27; the Future resolves then).");
  m.def(
      "release_owner",
      [](const std::string& owner) {
        auto r = table().release_owner(owner);
        size_t n = r.regs.size();
        retire(std::move(r), nullptr);  // DA-27, DA-42
        return n;
      },
      nb::arg("owner"),
      "Ends every buffer of the actor `owner` (it stopped); returns how many. Their "
      "registrations are released once every reader leased one of them confirmed a "
      "revocation (DA-42), or once those leases ended (DA-27).");
  m.def(
      "lease_config",
      [] {
        return nb::make_tuple(lease_settings().ms.load(), lease_settings().max_bytes.load());
      },
      "(lease ms, max bytes): the lease this process asks for and grants at most, and the "
      "largest transfer that uses leases (PODIUM_RDMA_LEASE_MS, PODIUM_RDMA_LEASE_MAX_BYTES; "
      "DA-28).");
  m.def(
      "set_lease",
      [](int64_t ms, uint64_t max_bytes) {
        lease_settings().ms = ms;
        lease_settings().max_bytes = max_bytes;
      },
      nb::arg("ms"), nb::arg("max_bytes"),
      "Sets this process's lease time (0: no leases) and bound, as the environment would "
      "(tests, benchmarks).");
  m.def(
      "lease_left",
      [](const std::string& owner, uint64_t id, bool write) {
        auto left = leases().left(owner, id, write, Clock::now());
        return std::chrono::duration<double>(left).count();
      },
      nb::arg("owner"), nb::arg("id"), nb::arg("write"),
      "Seconds left of this process's lease on buffer `id` of the proc `owner` (0: none).");
  m.def(
      "lease_stats",
      [] {
        nb::dict d;
        d["checks_answered"] = g_checks_answered.load();
        d["delayed_releases"] = g_delayed_releases.load();
        d["leased"] = g_leased.load();
        d["checked"] = g_checked.load();
        d["leases"] = leases().size();
        d["released_on_revocation"] = g_released_on_revocation.load();
        d["revocations_answered"] = g_revocations_answered.load();
        d["revocations_unconfirmed"] = g_revocations_unconfirmed.load();
        return d;
      },
      "Counters of leases (DA-26..DA-28, DA-42): checks this process answered as an owner, "
      "drops and releases it delayed for a lease, transfers it ran under leases and checked, "
      "leases held, drops and owner stops whose buffers it released once every lessee "
      "confirmed a revocation (before the leases' end), revocations it answered as a reader, "
      "revocations it asked for that a lessee did not confirm (its proc ended, the message "
      "failed).");
  m.def("transfer", &transfer, nb::arg("ops"), nb::arg("timeout_s"),
        "Runs one-sided operations, each (write, owner_proc, id, token, remote_addr, rkey, "
        "worker_address, local, size, same_host, owner_pid, remote_cuda, window, checksum): "
        "checked by their owners, then in parallel (same_host: the owner runs on this host, DA-9; "
        "its pid: CMA, DA-10; window: the buffer's shared pages, register_buffer's, DA-30). A "
        "CoreFuture of one reply; with a summed read (checksum, DA-41), its one part holds every "
        "operation's word sum (DA-40), 8 bytes little-endian each.");
  m.def(
      "registration_count",
      [] {
        if (mesh::Runtime::current() == nullptr) return size_t{0};
        auto e = instance();
        return e ? (*e)->registration_count() : size_t{0};
      },
      "Regions this process has registered now (DA-2).");
  m.def("buffer_count", [] { return table().size(); }, "Buffers this process owns now.");
  m.def(
      "wait_given_back",
      [] {
        nb::gil_scoped_release unlocked;
        data::shm::wait_given_back();
      },
      "Waits until the pages of every buffer of this process that ended are private again "
      "(DA-32: the give-back runs on a thread of its own; benchmarks wait for it so that it "
      "does not share the CPU with what they time next).");
  m.def(
      "stats",
      [] {
        auto s = engine().stats();
        nb::dict d;
        d["transfers"] = s.transfers;
        d["chunks"] = s.chunks;
        d["bytes"] = s.bytes;
        d["timeouts"] = s.timeouts;
        d["endpoints"] = s.endpoints;
        d["active"] = s.active;
        d["copiers"] = s.copiers;
        d["window_bytes"] = s.window_bytes;
        d["caller_copied"] = s.caller_copied;
        d["windows"] = reader_window_count();
        return d;
      },
      "The engine's counters.");
}

}  // namespace podium::python
