// podium._core.data, the reader's side (docs/data.md): transfer() checks every operation's
// token with its owner over the control plane (one message per owner, failing at once when the
// runtime knows the owner's proc ended, ME-2), then runs the one-sided operations on the
// engine; a check may grant a lease, under which later small transfers skip it (DA-26..DA-28),
// and a single leased operation is copied at once by copy_leased_now (DA-43). transfer() and
// the holder's drop() return a CoreFuture of one reply: ok, or the error. An error of
// operation i of a transfer starts with "\x1f<i>\x1f", so podium.rdma names that operation's
// buffer. The owner's side is data_owner.cc; the module's functions, data.cc.
//
//   DA-41 A summed read (an operation marked `checksum`: a get into host memory) resolves to
//         the word sum (DA-40) of its local region once the transfer is complete: summed by
//         its caller's copy as it copies when copied at once (copy_leased_now, DA-43; the sum
//         is its return), by the engine's chunks as they copy it where the engine copies it
//         itself (CMA, shared pages: DA-44), and only through UCX over the local region after
//         the engine completed the transfer, on the thread that completes the engine's
//         future; before the outcome is finished. The transfer's ok reply then has one part:
//         every operation's sum (0 for the others), 8 bytes each, little-endian. A transfer
//         with no summed operation replies with no part. A transfer that fails sums nothing.
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
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <atomic>
#include <chrono>
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
#include "podium/channel/address.h"
#include "podium/data/checksum.h"
#include "podium/data/engine.h"
#include "podium/data/lease.h"
#include "podium/mesh/cast.h"
#include "podium/mesh/runtime.h"

namespace podium::python {
namespace {

using namespace dataplane;  // data_internal.h

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

// The reader's leases (DA-26); like table(), lives as long as the process.
data::LeaseCache& leases() {
  static auto* c = new data::LeaseCache();
  return *c;
}

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
  return retag(err, p.members[g]);
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

}  // namespace

namespace dataplane {

// DA-42: the reader's "rdma_revoke" (args = [owner proc], numbers = [id]), from an owner
// that drops a buffer this process holds a lease of: answered once no transfer of this
// process holds that buffer.
void install_revoke_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
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
               remote_cuda, window, checksum, bulk] = py;
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

namespace {
// The operations that go through the owners' checks and the engine (UCX, CMA, shared pages).
CoreFuture checked_transfer(const std::vector<PyOp>& py_ops, double timeout_s);
}  // namespace

CoreFuture transfer(const std::vector<PyOp>& py_ops, double timeout_s) {
  release_deferred();
  // DA-49: every operation over podium's TCP path, some of them, or none.
  if (bulk_eligible(py_ops)) return bulk_transfer(py_ops, timeout_s);
  for (const auto& op : py_ops) {
    if (bulk_eligible({op})) return split_transfer(py_ops, timeout_s, checked_transfer);
  }
  return checked_transfer(py_ops, timeout_s);
}

namespace {
CoreFuture checked_transfer(const std::vector<PyOp>& py_ops, double timeout_s) {
  install_revoke_handler();
  auto p = std::make_shared<Plan>();
  p->eng = &engine();
  p->timeout = seconds_to_ns(timeout_s);
  p->deadline = Clock::now() + p->timeout;
  p->out = std::make_shared<Outcome>();
  CoreFuture result(p->out->promise.future());
  std::unordered_map<std::string, size_t> owner_index;
  uint64_t total = 0;
  for (size_t i = 0; i < py_ops.size(); ++i) {
    const auto& [write, owner, id, token, remote_addr, rkey, worker, local, size, same_host,
                 pid, remote_cuda, window, checksum, bulk] = py_ops[i];
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

// Asks `owner` to drop buffer `id` (the "drop" binding): this process's leases of it go first.
CoreFuture drop(const std::string& owner, uint64_t id, const std::string& token,
                double timeout_s) {
  auto out = std::make_shared<Outcome>();
  CoreFuture result(out->promise.future());
  nb::gil_scoped_release unlocked;
  bound(out, seconds_to_ns(timeout_s), "the drop of RDMA buffer " + std::to_string(id));
  leases().forget(owner, id, false);
  leases().forget(owner, id, true);
  ask_proc(owner, actor::SystemHeader{"rdma_drop", {token}, {id}},
           [out](const Status& st, uint64_t) { out->finish(st); });
  return result;
}

}  // namespace dataplane
}  // namespace podium::python
