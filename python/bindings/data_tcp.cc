// podium._core.data, the data plane's own path over TCP between hosts (tcp_bulk.h; docs/data.md,
// "Across hosts: podium's TCP path"): the owner's server, and the reader's transfers to it.
//
//   DA-48 A proc whose control plane listens on TCP serves its buffers on a TCP bulk server
//         of its own, started with its first buffer, on the numeric address of its control
//         plane's host (a wildcard stands for default_host_address()); a buffer's reference
//         carries that server's "HOST:PORT". No server where the control plane is a Unix
//         socket (a job of one host), where no local interface holds the address (a NAT'ed
//         DIAL@BIND address), or with PODIUM_RDMA_TCP=0; then the reference carries "" and
//         UCX moves the bytes, as before. The server proves, and asks, the job's secret
//         (DA-45).
//   DA-49 A transfer goes over podium's TCP path when every operation is on an owner of
//         another host (RD-6) with a TCP bulk address, between host memory on both sides, and
//         PODIUM_RDMA_TCP is not 0; no owner's check precedes it and no lease is asked (the
//         owner's server checks each request, DA-45). The runtime's knowledge that an owner's
//         proc ended fails it first (RD-2). A transfer of one operation of at most
//         kCallerCopyBytes is worked on by its caller, with the GIL released, for at most
//         kInlineBudget, and handed to the podium-tcp-rd threads only if it has not finished
//         by then; every other transfer runs on those threads, each operation on its own
//         connection, in parallel, and an operation of at least kStripeMin bytes as
//         PODIUM_RDMA_TCP_STRIPES (default 4) stripes of its range, each on a connection
//         of its own (one plain socket did not reach what the link carries: a 1 GiB read
//         between namespace hosts of the 2-core VM went from 1.75 to 2.2 GB/s to 2.7 to 2.9). The first failure wins, tagged with its operation; a
//         summed read is summed over the local bytes once they all arrived (DA-41).
//   DA-52 A transfer of one operation over the TCP path that its caller finished at once
//         (DA-49) returns its outcome to Python as a plain value (bulk_now()): podium.rdma
//         resolves it without a C++ future to wait on or decode, as DA-43 does on one host.
//         A failed one, or one handed over, returns its CoreFuture, decoded as any transfer's.
//
// Threads: any Python thread calls in; the podium-tcp-rd threads (at most kMaxWorkers, made
// as needed, `PODIUM_RDMA_NICE` steps below the process, DA-11) finish what callers hand over.
// None takes the GIL: a pinned Python buffer is released later under the GIL (common.h).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <spdlog/spdlog.h>
#include <pthread.h>

#include "common.h"
#include "data_internal.h"
#include "future.h"
#include "podium/actor/proc.h"
#include "podium/data/checksum.h"
#include "podium/data/cma.h"
#include "podium/data/tcp_bulk.h"
#include "podium/mesh/job_config.h"
#include "podium/mesh/runtime.h"

namespace podium::python::dataplane {
namespace {

// DA-49: how long a caller works on its own small transfer before handing it over.
constexpr auto kInlineBudget = std::chrono::milliseconds(5);
constexpr size_t kMaxWorkers = 8;
// DA-49: an operation of at least this many bytes moves as stripes() stripes.
constexpr uint64_t kStripeMin = uint64_t{16} << 20;
size_t stripes() {
  static const size_t n = [] {
    const char* env = std::getenv("PODIUM_RDMA_TCP_STRIPES");
    long v = env != nullptr && *env != '\0' ? std::strtol(env, nullptr, 10) : 4;
    return static_cast<size_t>(std::clamp(v, 1L, 8L));
  }();
  return n;
}

// PODIUM_RDMA_TCP at the first call, until set_tcp_path() changes it.
std::atomic<bool>& tcp_on() {
  static std::atomic<bool> on{[] {
    const char* env = std::getenv("PODIUM_RDMA_TCP");
    return env == nullptr || std::string(env) != "0";
  }()};
  return on;
}
bool tcp_enabled() { return tcp_on().load(std::memory_order_relaxed); }

int data_nice() {
  const char* env = std::getenv("PODIUM_RDMA_NICE");
  if (env == nullptr || *env == '\0') return data::kDefaultNice;
  return std::clamp(std::atoi(env), 0, 19);
}

std::string secret() {
  auto s = mesh::internal::job_secret();
  return s ? *s : std::string();
}

std::atomic<uint64_t> g_tcp_transfers{0}, g_tcp_inline{0}, g_tcp_handed{0}, g_tcp_failed{0};

struct Server {
  std::once_flag once;
  std::unique_ptr<data::BulkServer> server;
  std::string address;
  std::atomic<data::BulkServer*> live{nullptr};  // `server`, published once started
};
Server& server() {
  static auto* s = new Server();  // lives as long as the process, as table() does
  return *s;
}

void after_fork_in_child();

data::BulkPool& pool() {
  static auto* p = [] {
    static std::once_flag fork_once;
    std::call_once(fork_once, [] { ::pthread_atfork(nullptr, nullptr, after_fork_in_child); });
    return new data::BulkPool(secret());
  }();
  return *p;
}

// The podium-tcp-rd threads: they run what callers hand over (DA-49).
struct Workers {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;  // guarded by mu
  size_t threads = 0, idle = 0;             // guarded by mu

  void post(std::function<void()> f) {
    bool spawn = false;
    {
      std::lock_guard lock(mu);
      queue.push_back(std::move(f));
      if (idle == 0 && threads < kMaxWorkers) {
        ++threads;
        spawn = true;
      }
    }
    if (spawn) {
      std::thread([this] { run(); }).detach();
    } else {
      cv.notify_one();
    }
  }
  void run() {
    pthread_setname_np(pthread_self(), "podium-tcp-rd");
    data::cma::lower_priority(data_nice());  // DA-11
    std::unique_lock lock(mu);
    for (;;) {
      ++idle;
      cv.wait(lock, [this] { return !queue.empty(); });
      --idle;
      auto f = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      f();
      lock.lock();
    }
  }
};
Workers& workers() {
  static auto* w = new Workers();
  return *w;
}

// A child forked from a process that used the TCP path has none of its threads: the
// podium-tcp-rd threads and the bulk server are the parent's. The child makes its own
// workers as needed, and shares no connection with the parent (BulkPool::forget_after_fork);
// its buffers are not served over TCP (the server's port is the parent's): UCX, or an error
// naming the buffer, reaches them.
void after_fork_in_child() {
  auto* w = &workers();
  new (&w->mu) std::mutex();
  new (&w->cv) std::condition_variable();
  w->queue.clear();
  w->threads = w->idle = 0;
  pool().forget_after_fork();
  server().live.store(nullptr, std::memory_order_relaxed);
  server().address.clear();  // the port is the parent's: the child's buffers do not name it
}

// One transfer over the TCP path: its calls, and the one reply.
struct Bulk {
  actor::Promise<mesh::Replies> promise;
  std::vector<std::unique_ptr<data::BulkCall>> calls;
  std::vector<size_t> op_of;                  // per call: the operation it moves (a stripe)
  std::vector<std::shared_ptr<Buffer>> keep;  // per operation: its local region, pinned
  std::vector<bool> summed;
  bool any_summed = false;
  std::atomic<size_t> left{0};
  std::atomic<bool> finished{false};

  void finish(const Status& st, std::vector<Buffer> parts = {}) {
    if (finished.exchange(true)) return;
    if (!st) ++g_tcp_failed;
    promise.set(st ? mesh::Replies{mesh::Reply(std::move(parts))}
                   : mesh::Replies{mesh::Reply(std::unexpected(st.error()))});
  }
  // Call `i` ended: the first failure finishes the transfer; the last success does.
  void ended(size_t i) {
    const auto& st = calls[i]->status();
    if (!st) {
      finish(std::unexpected(tagged(op_of[i], st.error())));
    }
    if (left.fetch_sub(1) != 1 || finished.load()) return;
    std::vector<Buffer> parts;
    if (any_summed) {  // DA-41
      std::vector<uint64_t> sums(keep.size(), 0);
      for (size_t k = 0; k < sums.size(); ++k) {
        if (summed[k]) sums[k] = data::word_sum(keep[k]->data(), summed_size[k]);
      }
      parts.push_back(Buffer::copy_of(data::encode_sums(sums)));
    }
    finish({}, std::move(parts));
  }
  std::vector<size_t> summed_size;
};

// Runs call `i` on a podium-tcp-rd thread until it ends.
void hand_over(const std::shared_ptr<Bulk>& b, size_t i) {
  workers().post([b, i] {
    b->calls[i]->advance(std::chrono::steady_clock::time_point::max());
    b->ended(i);
  });
}

}  // namespace

const std::string& bulk_address() {
  auto& s = server();
  std::call_once(s.once, [&s] {
    if (!tcp_enabled()) return;  // a server is started only where the path was on at first
    std::string ip = control_plane_ip();
    if (ip.empty()) return;
    auto started = data::BulkServer::start({ip, secret(), data_nice()}, table());
    if (!started) {
      spdlog::warn("podium data: no TCP bulk server on {} ({}); transfers from other hosts use "
                   "UCX's TCP transport",
                   ip, started.error().message);
      return;
    }
    s.server = std::move(*started);
    s.address = s.server->address();
    s.live.store(s.server.get(), std::memory_order_release);
  });
  return s.address;
}

void after_bulk_idle(uint64_t id, std::function<void()> then) {
  auto* srv = server().live.load(std::memory_order_acquire);
  if (srv == nullptr) {
    then();
    return;
  }
  srv->after_idle(id, [then = std::move(then)] {
    // From the server's thread to the proc's loop, where the drop's other work runs.
    if (mesh::Runtime::current() != nullptr) {
      asio::post(mesh::Runtime::get().proc().io(), then);
    } else {
      then();
    }
  });
}

bool bulk_eligible(const std::vector<PyOp>& py_ops) {
  if (py_ops.empty() || !tcp_enabled()) return false;
  for (const auto& op : py_ops) {
    const auto& local = std::get<7>(op);
    bool same_host = std::get<9>(op), remote_cuda = std::get<11>(op);
    // A tuple region (address, size, tensor[, cuda]) of CUDA memory stays with UCX (DA-23).
    bool local_cuda = false;
    if (nb::isinstance<nb::tuple>(local)) {
      auto t = nb::borrow<nb::tuple>(local);
      local_cuda = t.size() == 3 || (t.size() == 4 && nb::cast<bool>(t[3]));
    }
    if (same_host || remote_cuda || local_cuda || std::get<14>(op).empty()) return false;
  }
  return true;
}

CoreFuture bulk_transfer(const std::vector<PyOp>& py_ops, double timeout_s) {
  auto b = std::make_shared<Bulk>();
  CoreFuture result(b->promise.future());
  result.completed_off_loop();  // DA-35: data-plane threads, or the caller, complete it
  auto deadline = std::chrono::steady_clock::now() + seconds_to_ns(timeout_s);
  ++g_tcp_transfers;
  uint64_t total = 0;
  std::vector<std::string> owners;
  for (size_t i = 0; i < py_ops.size(); ++i) {
    const auto& [write, owner, id, token, remote_addr, rkey, worker, local, size, same_host,
                 pid, remote_cuda, window, checksum, bulk] = py_ops[i];
    auto [pinned, memory] = region_from_python(local, !write);
    if (pinned.size() < size) {
      throw nb::value_error("transfer: the local buffer is smaller than the operation");
    }
    if (checksum && write) throw nb::value_error("transfer: only a read can be summed");
    auto kept = std::make_shared<Buffer>(std::move(pinned));
    auto* local_bytes = const_cast<std::byte*>(kept->data());
    b->keep.push_back(std::move(kept));
    b->summed.push_back(checksum);
    b->summed_size.push_back(size);
    b->any_summed = b->any_summed || checksum;
    // RD-2: the runtime's knowledge that the owner's proc ended, asked while the call waits.
    auto gone = [owner = owner]() -> std::optional<Error> {
      if (mesh::Runtime::current() == nullptr) return std::nullopt;
      return mesh::Runtime::get().proc_dead(owner);
    };
    // DA-49: a large operation moves as stripes over connections of their own, at once.
    size_t n = size >= kStripeMin ? stripes() : 1;
    uint64_t step = (size / n + 4095) & ~uint64_t{4095};
    for (uint64_t off = 0; off < size; off += step) {
      uint64_t len = std::min<uint64_t>(step, size - off);
      data::BulkRequest req{write ? data::BulkKind::kPut : data::BulkKind::kGet, id, off, len,
                            token};
      b->calls.push_back(std::make_unique<data::BulkCall>(pool(), bulk, std::move(req),
                                                          local_bytes + off, deadline, gone));
      b->op_of.push_back(i);
    }
    owners.push_back(owner);
    total += size;
  }
  b->left = b->calls.size();
  for (size_t i = 0; i < owners.size(); ++i) {  // RD-2, before anything moves
    if (auto dead = mesh::Runtime::get().proc_dead(owners[i])) {
      b->finish(std::unexpected(tagged(i, *dead)));
      return result;
    }
  }
  nb::gil_scoped_release unlocked;
  if (b->calls.size() == 1 && total <= data::kCallerCopyBytes) {
    if (b->calls[0]->advance(std::chrono::steady_clock::now() + kInlineBudget)) {
      ++g_tcp_inline;
      b->ended(0);
      return result;
    }
    ++g_tcp_handed;
  }
  for (size_t i = 0; i < b->calls.size(); ++i) hand_over(b, i);
  return result;
}

nb::object bulk_now(const std::vector<PyOp>& py_ops, double timeout_s) {
  if (py_ops.size() != 1 || !bulk_eligible(py_ops)) return nb::none();
  release_deferred();
  CoreFuture f = bulk_transfer(py_ops, timeout_s);
  if (f.ready()) {
    const auto& r = f.future().get();
    if (r && !r->first_error()) {
      uint64_t sum = 0;  // DA-41: a summed read's one sum, 8 little-endian bytes
      const auto& parts = (*r)[0];
      if (parts && !parts->empty() && parts->front().view().size() >= 8) {
        sum = data::sum_at(parts->front().view(), 0);
      }
      return nb::int_(sum);
    }
  }
  return nb::cast(std::move(f));
}

void set_tcp_path(bool on) { tcp_on() = on; }
bool tcp_path_on() { return tcp_enabled(); }

// Operation `k` of a part is operation `index[k]` of the whole: its tag says so (tagged()).
Error retag(const Error& e, const std::vector<size_t>& index) {
  const auto& m = e.message;
  size_t op = index.front();
  std::string text = m;
  if (m.size() > 2 && m[0] == '\x1f') {
    size_t end = m.find('\x1f', 1);
    if (end != std::string::npos) {
      size_t k = std::stoul(m.substr(1, end - 1));
      if (k < index.size()) op = index[k];
      text = m.substr(end + 1);
    }
  }
  return tagged(op, Error{e.subsystem, e.code, text});
}

CoreFuture split_transfer(const std::vector<PyOp>& py_ops, double timeout_s,
                          const std::function<CoreFuture(const std::vector<PyOp>&, double)>& rest) {
  std::vector<PyOp> tcp_ops, other_ops;
  std::vector<size_t> tcp_index, other_index;
  for (size_t i = 0; i < py_ops.size(); ++i) {
    if (bulk_eligible({py_ops[i]})) {
      tcp_ops.push_back(py_ops[i]);
      tcp_index.push_back(i);
    } else {
      other_ops.push_back(py_ops[i]);
      other_index.push_back(i);
    }
  }
  struct Join {
    actor::Promise<mesh::Replies> promise;
    std::mutex mu;
    size_t left = 2;
    bool failed = false;
    std::vector<uint64_t> sums;
    bool any_summed = false;
  };
  auto join = std::make_shared<Join>();
  join->sums.assign(py_ops.size(), 0);
  for (const auto& op : py_ops) join->any_summed = join->any_summed || std::get<13>(op);
  CoreFuture result(join->promise.future());
  auto part = [join](std::vector<size_t> index) {
    return [join, index = std::move(index)](const Result<mesh::Replies>& r) {
      std::optional<Error> err;
      if (!r) {
        err = retag(r.error(), index);
      } else if (auto e = r->first_error()) {
        err = retag(*e->second, index);
      }
      std::lock_guard lock(join->mu);
      if (join->failed) return;
      if (err) {  // the first failure wins (AC-4)
        join->failed = true;
        join->promise.set(mesh::Replies{mesh::Reply(std::unexpected(*err))});
        return;
      }
      const auto& parts = (*r)[0];
      if (parts && !parts->empty()) {  // DA-41: this part's sums, 8 little-endian bytes each
        auto raw = parts->front().view();
        for (size_t k = 0; k < index.size() && 8 * k + 8 <= raw.size(); ++k) {
          join->sums[index[k]] = data::sum_at(raw, k);
        }
      }
      if (--join->left > 0) return;
      std::vector<Buffer> out;
      if (join->any_summed) out.push_back(Buffer::copy_of(data::encode_sums(join->sums)));
      join->promise.set(mesh::Replies{mesh::Reply(std::move(out))});
    };
  };
  auto tcp = bulk_transfer(tcp_ops, timeout_s);
  auto other = rest(other_ops, timeout_s);
  // DA-35: its waiter drives the loop only where the checked part would have it do so.
  if (!other.drives_loop()) result.completed_off_loop();
  tcp.future().on_ready(part(std::move(tcp_index)));
  other.future().on_ready(part(std::move(other_index)));
  return result;
}

nb::dict bulk_stats() {
  nb::dict d;
  d["transfers"] = g_tcp_transfers.load();
  d["inline"] = g_tcp_inline.load();
  d["handed_over"] = g_tcp_handed.load();
  d["failed"] = g_tcp_failed.load();
  d["idle_connections"] = pool().idle();
  auto* live = server().live.load(std::memory_order_acquire);
  d["address"] = live != nullptr ? live->address() : std::string();
  if (auto* srv = server().live.load(std::memory_order_acquire)) {
    auto s = srv->stats();
    d["accepted"] = s.accepted;
    d["authenticated"] = s.authenticated;
    d["refused_auth"] = s.refused_auth;
    d["requests"] = s.requests;
    d["refused"] = s.refused;
    d["bytes"] = s.bytes;
    d["connections"] = s.connections;
  }
  return d;
}

}  // namespace podium::python::dataplane
