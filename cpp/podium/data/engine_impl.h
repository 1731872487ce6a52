// The engine's internals (engine.h), shared by engine.cc (transfers, the progress and copy
// threads) and engine_setup.cc (the UCX context and worker, registration, memory types).
// Included by those two files only.
#pragma once

#include "podium/data/engine.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "podium/data/cma.h"

namespace podium::data {

namespace detail {

using Clock = std::chrono::steady_clock;

// DA-22: UCX's software RMA over TCP moves a get's reply and a put in active messages of at
// most one TCP segment each (8 KiB by default), and acknowledges every put segment; 1 MiB
// segments cut the messages and acknowledgements 128-fold (docs/data.md, "Across hosts").
// DA-24: the first UCX 1.x release where RMA_PPLN_ENABLE was seen (1.22).
inline constexpr unsigned kRmaPplnMinor = 22;

inline constexpr std::pair<const char*, const char*> kTcpSegDefaults[] = {
    {"TX_SEG_SIZE", "1m"}, {"RX_SEG_SIZE", "1m"}};

inline Error ucx_error(DataErrc code, std::string_view what, ucs_status_t st) {
  return make_error(code, std::string(what) + ": " + ucs_status_string(st));
}

inline std::string human_bytes(size_t n) {
  if (n >= (size_t{1} << 20)) return std::to_string(n >> 20) + " MiB";
  if (n >= (size_t{1} << 10)) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " B";
}

struct Endpoint {
  ucp_ep_h ep = nullptr;
  bool peer_mode = true;  // UCP_ERR_HANDLING_MODE_PEER (DA-6); false: NONE (DA-9)
  bool failed = false;  // set by UCX's error handler (DA-6)
  std::string why;
  size_t users = 0;     // transfers that use it now
};

struct Transfer;

struct OpState {
  Op op;
  std::shared_ptr<Endpoint> ep;
  ucp_rkey_h rkey = nullptr;
  size_t next = 0;      // the offset of the next chunk to post
  size_t inflight = 0;  // chunk requests in UCX's hands (or CMA chunks being copied)
  bool flushing = false;
  bool done = false;
  bool cma = false;     // DA-10: copied with process_vm_readv/writev, not through UCX
};

// One CMA chunk, taken under the lock and copied outside it (DA-10).
struct CmaJob {
  std::shared_ptr<Transfer> t;
  size_t op = 0;
  size_t offset = 0;
  size_t len = 0;
  uint64_t window = 0;  // of which copied through shared pages (DA-30)
};

struct Transfer {
  actor::Promise<void> promise;
  std::vector<OpState> ops;
  Clock::time_point deadline;
  std::chrono::nanoseconds timeout{};
  size_t ops_left = 0;
  size_t outstanding = 0;  // requests (chunks, flushes) in UCX's hands
  bool settled = false;
  bool retired = false;
};

// Copies `job`, outside the engine's lock (DA-10); a summed get's chunk adds its share of
// the operation's sum as it is copied (DA-44).
inline int copy_job(CmaJob& job) {
  const Op& op = job.t->ops[job.op].op;
  uint64_t part = 0;
  int err = cma::copy(op, job.offset, job.len, &job.window, op.sum ? &part : nullptr);
  if (err == 0 && op.sum) op.sum->value.fetch_add(part, std::memory_order_relaxed);
  return err;
}

// user_data of one UCX request.
struct Request {
  Engine::Impl* impl = nullptr;
  std::shared_ptr<Transfer> t;
  size_t op = 0;
  bool flush = false;
};

}  // namespace detail

using namespace detail;  // internal header: the .cc files and Impl use these names

struct Engine::Impl {
  EngineConfig config;
  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;
  std::string address;
  std::string net_devices;  // DA-21: what UCX was restricted to ("": every device)
  int efd = -1;      // the worker's event fd (-1: UCX gave none; the thread polls)
  int wake_fd = -1;  // eventfd: new work or stop
  std::thread progress;
  std::vector<std::thread> copy_threads;  // DA-11
  std::condition_variable cma_cv;         // with mu: CMA chunks to copy, or stopping

  bool tcp_only = false;  // UCX_TLS names TCP and no shared-memory transport (DA-9)
  bool cuda_memory = false;  // DA-23: UCX reaches CUDA memory (set once, before any thread)
  bool ucx_tcp = true;       // DA-51: UCX's tcp transport may run (set once, before any thread)
  bool cma_enabled = false;  // DA-10; turned off for good by a CMA copy the kernel refuses
  mutable std::mutex mu;  // every UCX call and everything below
  bool stopping = false;
  std::unordered_map<std::string, std::shared_ptr<Endpoint>> eps;
  std::vector<std::pair<ucs_status_ptr_t, std::shared_ptr<Endpoint>>> closing;
  std::unordered_set<std::shared_ptr<Transfer>> active;
  std::deque<std::pair<std::shared_ptr<Transfer>, size_t>> cma_ops;  // ops with CMA chunks left
  std::map<std::pair<uint64_t, size_t>, std::weak_ptr<Registration>> regs;
  size_t live_regs = 0;
  Stats stats;
  // Settled under mu, set after it is released (no callback runs under mu).
  std::vector<std::pair<actor::Promise<void>, Status>> fire;

  ~Impl() {
    if (worker) ucp_worker_destroy(worker);
    if (ctx) ucp_cleanup(ctx);
    if (wake_fd >= 0) ::close(wake_fd);
  }

  void wake() const {
    uint64_t one = 1;
    ssize_t n = ::write(wake_fd, &one, sizeof one);
    (void)n;  // EAGAIN: a wake-up is pending anyway
  }

  void fire_all(std::vector<std::pair<actor::Promise<void>, Status>>& f) {
    for (auto& [p, st] : f) p.set(std::move(st));
    f.clear();
  }

  // --- under mu ----------------------------------------------------------------------------

  static void on_ep_error(void* arg, ucp_ep_h, ucs_status_t st) {
    auto* e = static_cast<Endpoint*>(arg);
    e->failed = true;
    e->why = ucs_status_string(st);
  }

  // DA-9: same-host peers get UCP_ERR_HANDLING_MODE_NONE, which lets UCX use shared memory
  // and CMA (UCX 1.13 offers them no peer-failure handling); others get PEER (DA-6).
  bool wants_peer_mode(bool same_host) const { return !same_host || tcp_only; }
  void tls_restricted_to_tcp(const std::string& tls, bool names_shm) {
    tcp_only = tls.find("tcp") != std::string::npos && !names_shm && tls[0] != '^';
  }

  Result<std::shared_ptr<Endpoint>> endpoint(const std::string& peer_address, bool same_host) {
    bool peer_mode = wants_peer_mode(same_host);
    std::string peer = std::string(peer_mode ? "P" : "N") + peer_address;
    auto it = eps.find(peer);
    if (it != eps.end() && !it->second->failed) return it->second;
    if (it != eps.end()) close_ep(it);
    if (peer.empty()) {
      return std::unexpected(make_error(DataErrc::kInvalidArgument, "empty worker address"));
    }
    auto e = std::make_shared<Endpoint>();
    e->peer_mode = peer_mode;
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = reinterpret_cast<const ucp_address_t*>(peer_address.data());
    p.err_mode = peer_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    p.err_handler.cb = &Impl::on_ep_error;
    p.err_handler.arg = e.get();
    if (!peer_mode) {
      p.field_mask &= ~static_cast<uint64_t>(UCP_EP_PARAM_FIELD_ERR_HANDLER);
    }
    ucs_status_t st = ucp_ep_create(worker, &p, &e->ep);
    if (st != UCS_OK) {
      // Unreachable: the peer's process ended, or no transport both sides offer connects.
      return std::unexpected(ucx_error(
          DataErrc::kTransferFailed,
          "cannot reach the peer: its process ended, or no UCX transport connects to it "
          "(ucp_ep_create; transports: " +
              std::string(std::getenv("UCX_TLS") ? std::getenv("UCX_TLS") : "UCX's default") +
              ")",
          st));
    }
    eps[peer] = e;
    stats.endpoints = eps.size();
    return e;
  }

  void close_ep(std::unordered_map<std::string, std::shared_ptr<Endpoint>>::iterator it) {
    auto e = it->second;
    eps.erase(it);
    stats.endpoints = eps.size();
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = e->peer_mode ? UCP_EP_CLOSE_FLAG_FORCE : 0;  // FORCE needs PEER mode
    ucs_status_ptr_t s = ucp_ep_close_nbx(e->ep, &p);
    if (s != nullptr && UCS_PTR_IS_PTR(s)) closing.emplace_back(s, std::move(e));
  }

  void sweep_closing() {
    for (size_t i = 0; i < closing.size();) {
      if (ucp_request_check_status(closing[i].first) != UCS_INPROGRESS) {
        ucp_request_free(closing[i].first);
        closing[i] = std::move(closing.back());
        closing.pop_back();
      } else {
        ++i;
      }
    }
    for (auto it = eps.begin(); it != eps.end();) {
      auto cur = it++;
      if (cur->second->failed && cur->second->users == 0) close_ep(cur);
    }
  }

  void settle(const std::shared_ptr<Transfer>& t, Status st) {
    if (t->settled) return;
    t->settled = true;
    fire.emplace_back(std::move(t->promise), std::move(st));
  }

  void maybe_retire(const std::shared_ptr<Transfer>& t) {
    if (!t->settled || t->outstanding != 0 || t->retired) return;
    t->retired = true;
    for (auto& o : t->ops) {
      if (o.rkey) ucp_rkey_destroy(o.rkey);
      o.rkey = nullptr;
      if (o.ep) --o.ep->users;
    }
    active.erase(t);
    stats.active = active.size();
  }

  std::string op_text(const Transfer& t, size_t i) const {
    const auto& o = t.ops[i].op;
    return std::string(o.kind == Op::Kind::kGet ? "get" : "put") + " of " + human_bytes(o.size);
  }

  void fail(const std::shared_ptr<Transfer>& t, size_t i, ucs_status_t st) {
    std::string why = t->ops[i].ep && t->ops[i].ep->failed ? t->ops[i].ep->why
                                                             : ucs_status_string(st);
    settle(t, std::unexpected(make_error(
                  DataErrc::kTransferFailed,
                  op_text(*t, i) + " failed in UCX: " + why +
                      " (the peer's process ended or its connection broke)")));
  }

  // The next chunk of op i; UCS_INPROGRESS when UCX holds it, UCS_OK when it is done already.
  ucs_status_t post_chunk(const std::shared_ptr<Transfer>& t, size_t i) {
    auto& o = t->ops[i];
    size_t len = std::min(config.chunk_bytes, o.op.size - o.next);
    auto* rq = new Request{this, t, i, false};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &Impl::on_request;
    p.user_data = rq;
    if (o.op.local_memory == Memory::kCuda) {
      // DA-23: UCX is told, not left to guess (a guess costs a lookup per chunk).
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
      p.memory_type = UCS_MEMORY_TYPE_CUDA;
    }
    void* local = o.op.local + o.next;
    uint64_t remote = o.op.remote_addr + o.next;
    ucs_status_ptr_t s = o.op.kind == Op::Kind::kGet
                             ? ucp_get_nbx(o.ep->ep, local, len, remote, o.rkey, &p)
                             : ucp_put_nbx(o.ep->ep, local, len, remote, o.rkey, &p);
    o.next += len;
    ++stats.chunks;
    if (s == nullptr || !UCS_PTR_IS_PTR(s)) {
      delete rq;
      return UCS_PTR_STATUS(s);
    }
    ++o.inflight;
    ++t->outstanding;
    return UCS_INPROGRESS;
  }

  // Posts what op i may post now (DA-3); finishes it when everything is done (DA-4).
  void pump(const std::shared_ptr<Transfer>& t, size_t i) {
    auto& o = t->ops[i];
    while (!t->settled && o.next < o.op.size && o.inflight < config.window) {
      ucs_status_t st = post_chunk(t, i);
      if (st != UCS_OK && st != UCS_INPROGRESS) {
        fail(t, i, st);
        return;
      }
    }
    if (t->settled || o.done || o.flushing || o.next < o.op.size || o.inflight > 0) return;
    if (o.op.kind == Op::Kind::kPut) {
      // DA-4: the bytes are at the peer only once the endpoint is flushed.
      auto* rq = new Request{this, t, i, true};
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      p.cb.send = &Impl::on_request;
      p.user_data = rq;
      ucs_status_ptr_t s = ucp_ep_flush_nbx(o.ep->ep, &p);
      if (s != nullptr && UCS_PTR_IS_PTR(s)) {
        o.flushing = true;
        ++t->outstanding;
        return;
      }
      delete rq;
      if (UCS_PTR_STATUS(s) != UCS_OK) {
        fail(t, i, UCS_PTR_STATUS(s));
        return;
      }
    }
    op_done(t, i);
  }

  void op_done(const std::shared_ptr<Transfer>& t, size_t i) {
    auto& o = t->ops[i];
    o.done = true;
    stats.bytes += o.op.size;
    if (--t->ops_left == 0) settle(t, {});
  }

  static void on_request(void* request, ucs_status_t st, void* user_data) {
    auto* rq = static_cast<Request*>(user_data);
    ucp_request_free(request);
    Impl* self = rq->impl;
    auto t = std::move(rq->t);
    size_t i = rq->op;
    bool flush = rq->flush;
    delete rq;
    --t->outstanding;
    auto& o = t->ops[i];
    if (flush) {
      o.flushing = false;
    } else {
      --o.inflight;
    }
    if (!t->settled) {
      if (st != UCS_OK) {
        self->fail(t, i, st);
      } else if (flush) {
        self->op_done(t, i);
      } else {
        self->pump(t, i);
      }
    }
    self->maybe_retire(t);
  }

  // DA-5: transfers past their deadline fail; their private endpoints are closed, which
  // cancels what they still have in flight.
  void sweep_timeouts(Clock::time_point now) {
    std::vector<std::shared_ptr<Transfer>> late;
    for (const auto& t : active) {
      if (!t->settled && now >= t->deadline) late.push_back(t);
    }
    for (const auto& t : late) {
      ++stats.timeouts;
      size_t bytes = 0;
      for (const auto& o : t->ops) bytes += o.op.size;
      settle(t, std::unexpected(make_error(
                    DataErrc::kTimeout,
                    "transfer of " + std::to_string(t->ops.size()) + " operation(s), " +
                        human_bytes(bytes) + ", did not finish within " +
                        std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                           t->timeout)
                                           .count()) +
                        " ms; nothing more is posted, and what was in flight is cancelled where "
                        "UCX can cancel it")));
      for (auto& o : t->ops) {
        if (o.ep && o.ep->peer_mode && (o.inflight > 0 || o.flushing) && o.ep->users == 1 &&
            !o.ep->failed) {
          for (auto it = eps.begin(); it != eps.end(); ++it) {
            if (it->second == o.ep) {
              close_ep(it);
              break;
            }
          }
        }
      }
      maybe_retire(t);
    }
  }

  // DA-11: an operation of at least 2 * kMinCmaChunk bytes is cut into at least `copiers`
  // chunks (page multiples), so one transfer keeps every copier busy.
  size_t cma_chunk(size_t size) const {
    size_t c = config.chunk_bytes;
    if (config.copiers > 1 && size >= 2 * kMinCmaChunk) {
      size_t share = (size + config.copiers - 1) / config.copiers;
      share = (share + 4095) & ~size_t{4095};
      c = std::min(c, std::max(share, kMinCmaChunk));
    }
    return c;
  }

  // DA-10, DA-11: the next CMA chunk, round robin over the ops that have some left.
  bool take_cma_job(CmaJob& job) {
    while (!cma_ops.empty()) {
      auto [t, i] = std::move(cma_ops.front());
      cma_ops.pop_front();
      auto& o = t->ops[i];
      if (t->settled || o.next >= o.op.size) {
        maybe_retire(t);
        continue;
      }
      job = CmaJob{t, i, o.next, std::min(cma_chunk(o.op.size), o.op.size - o.next)};
      o.next += job.len;
      ++o.inflight;
      ++t->outstanding;
      ++stats.chunks;
      if (o.next < o.op.size) cma_ops.emplace_back(t, i);
      return true;
    }
    return false;
  }

  // DA-37: the next chunk of op i of t, for the caller that shares its copy with the copiers.
  bool take_cma_chunk_of(const std::shared_ptr<Transfer>& t, size_t i, CmaJob& job) {
    auto& o = t->ops[i];
    if (t->settled || o.next >= o.op.size) return false;
    job = CmaJob{t, i, o.next, std::min(cma_chunk(o.op.size), o.op.size - o.next)};
    o.next += job.len;
    ++o.inflight;
    ++t->outstanding;
    ++stats.chunks;
    return true;
  }

  void finish_cma_job(CmaJob& job, int err) {
    auto& t = job.t;
    auto& o = t->ops[job.op];
    --o.inflight;
    --t->outstanding;
    stats.window_bytes += job.window;
    if (!t->settled) {
      if (err != 0) {
        if (err == EPERM) cma_enabled = false;  // later transfers go through UCX
        settle(t, std::unexpected(make_error(
                      DataErrc::kTransferFailed,
                      op_text(*t, job.op) + " with CMA from process " +
                          std::to_string(o.op.peer_pid) + " failed: " + std::strerror(err) +
                          (err == ESRCH ? " (the peer's process ended)"
                                        : err == EPERM ? " (the kernel refused; PODIUM_RDMA_CMA=0 "
                                                         "turns CMA off)"
                                                       : ""))));
      } else if (o.next == o.op.size && o.inflight == 0) {
        op_done(t, job.op);  // DA-4: process_vm_writev returns once the bytes are there
      }
    }
    maybe_retire(t);
  }

  // DA-11: a copy thread. It copies with no lock held; the only UCX calls it makes (a retired
  // transfer's rkeys) are made under mu, like every other.
  void copy_loop() {
    pthread_setname_np(pthread_self(), "podium-data-cp");
    cma::lower_priority(config.nice);
    std::vector<std::pair<actor::Promise<void>, Status>> ready;
    std::unique_lock lock(mu);
    for (;;) {
      cma_cv.wait(lock, [this] { return stopping || !cma_ops.empty(); });
      if (stopping) return;
      CmaJob job;
      if (!take_cma_job(job)) continue;
      lock.unlock();
      int err = copy_job(job);
      lock.lock();
      finish_cma_job(job, err);
      job.t.reset();
      if (!fire.empty()) {
        ready.swap(fire);
        lock.unlock();
        fire_all(ready);
        lock.lock();
      }
    }
  }

  void run() {
    pthread_setname_np(pthread_self(), "podium-data");
    cma::lower_priority(config.nice);
    std::vector<std::pair<actor::Promise<void>, Status>> ready;
    auto last_active = Clock::now();  // DA-34
    for (;;) {
      bool armed = false;
      bool busy = false;
      bool spinning_now = false;
      CmaJob job;
      bool copy = false;
      {
        std::lock_guard lock(mu);
        if (stopping) break;
        bool progressed = false;
        while (ucp_worker_progress(worker) != 0) progressed = true;
        auto now = Clock::now();
        if (progressed || !active.empty()) last_active = now;
        bool spinning = config.spin.count() > 0 && now - last_active < config.spin;  // DA-34
        spinning_now = spinning;
        sweep_closing();
        sweep_timeouts(now);
        copy = take_cma_job(job);
        if (copy && !cma_ops.empty()) cma_cv.notify_one();  // DA-11: a copier takes the next
        busy = !active.empty() || !closing.empty();
        if (!copy && !spinning) {
          ucs_status_t st = efd >= 0 ? ucp_worker_arm(worker) : UCS_OK;
          armed = st == UCS_OK;
        }
        ready.swap(fire);
      }
      fire_all(ready);
      if (copy) {
        int err = copy_job(job);  // outside the lock
        std::lock_guard lock(mu);
        finish_cma_job(job, err);
        continue;
      }
      if (!armed) {
        // Spinning (DA-34), or UCS_ERR_BUSY (events arrived meanwhile). A spinning thread lets
        // a submitter waiting for mu in first.
        if (spinning_now) std::this_thread::yield();
        continue;
      }
      pollfd fds[2] = {{wake_fd, POLLIN, 0}, {efd, POLLIN, 0}};
      // Busy: a short wait, so deadlines are kept and transports that signal no event still
      // progress. Idle: the event fd wakes us; the timeout only bounds a missed wake-up.
      int n = ::poll(fds, efd >= 0 ? 2 : 1, busy ? 1 : 100);
      if (n > 0) last_active = Clock::now();  // DA-34: woken by new work or a peer's message
      if (n > 0 && (fds[0].revents & POLLIN)) {
        uint64_t v;
        ssize_t r = ::read(wake_fd, &v, sizeof v);
        (void)r;
      }
    }
  }
};

}  // namespace podium::data
