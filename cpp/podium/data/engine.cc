// podium::data::Engine (engine.h): UCX context, worker, progress thread, registrations and
// chunked one-sided transfers.
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

namespace {

using Clock = std::chrono::steady_clock;

// DA-22: UCX's software RMA over TCP moves a get's reply and a put in active messages of at
// most one TCP segment each (8 KiB by default), and acknowledges every put segment; 1 MiB
// segments cut the messages and acknowledgements 128-fold (docs/data.md, "Across hosts").
constexpr std::pair<const char*, const char*> kTcpSegDefaults[] = {
    {"TX_SEG_SIZE", "1m"}, {"RX_SEG_SIZE", "1m"}};

Error ucx_error(DataErrc code, std::string_view what, ucs_status_t st) {
  return make_error(code, std::string(what) + ": " + ucs_status_string(st));
}

std::string human_bytes(size_t n) {
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

// user_data of one UCX request.
struct Request {
  Engine::Impl* impl = nullptr;
  std::shared_ptr<Transfer> t;
  size_t op = 0;
  bool flush = false;
};

}  // namespace

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

  void finish_cma_job(CmaJob& job, int err) {
    auto& t = job.t;
    auto& o = t->ops[job.op];
    --o.inflight;
    --t->outstanding;
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
      int err = cma::copy(job.t->ops[job.op].op, job.offset, job.len);
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
    for (;;) {
      bool armed = false;
      bool busy = false;
      CmaJob job;
      bool copy = false;
      {
        std::lock_guard lock(mu);
        if (stopping) break;
        while (ucp_worker_progress(worker) != 0) {
        }
        sweep_closing();
        sweep_timeouts(Clock::now());
        copy = take_cma_job(job);
        if (copy && !cma_ops.empty()) cma_cv.notify_one();  // DA-11: a copier takes the next
        busy = !active.empty() || !closing.empty();
        if (!copy) {
          ucs_status_t st = efd >= 0 ? ucp_worker_arm(worker) : UCS_OK;
          armed = st == UCS_OK;
        }
        ready.swap(fire);
      }
      fire_all(ready);
      if (copy) {
        int err = cma::copy(job.t->ops[job.op].op, job.offset, job.len);  // outside the lock
        std::lock_guard lock(mu);
        finish_cma_job(job, err);
        continue;
      }
      if (!armed) continue;  // UCS_ERR_BUSY: events arrived meanwhile
      pollfd fds[2] = {{wake_fd, POLLIN, 0}, {efd, POLLIN, 0}};
      // Busy: a short wait, so deadlines are kept and transports that signal no event still
      // progress. Idle: the event fd wakes us; the timeout only bounds a missed wake-up.
      int n = ::poll(fds, efd >= 0 ? 2 : 1, busy ? 1 : 100);
      if (n > 0 && (fds[0].revents & POLLIN)) {
        uint64_t v;
        ssize_t r = ::read(wake_fd, &v, sizeof v);
        (void)r;
      }
    }
  }
};

Registration::~Registration() {
  if (!memh_) return;
  auto* impl = static_cast<Engine::Impl*>(engine_.get());
  std::lock_guard lock(impl->mu);
  ucp_mem_unmap(impl->ctx, static_cast<ucp_mem_h>(memh_));
  auto it = impl->regs.find({addr_, size_});
  if (it != impl->regs.end() && it->second.expired()) impl->regs.erase(it);
  --impl->live_regs;
}

Engine::Engine(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() { stop(); }

std::string Engine::ucx_version() {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

Result<std::unique_ptr<Engine>> Engine::make(EngineConfig config) {
  if (config.chunk_bytes == 0 || config.window == 0) {
    return std::unexpected(
        make_error(DataErrc::kInvalidArgument, "chunk_bytes and window must be positive"));
  }
  if (config.copiers == 0) config.copiers = default_copiers();
  auto impl = std::make_shared<Impl>();
  impl->config = config;
  impl->stats.copiers = config.copiers;
  if (const char* tls = std::getenv("UCX_TLS")) {
    std::string t(tls);
    bool shm = false;
    for (const char* name : {"sm", "shm", "posix", "sysv", "cma", "xpmem", "knem", "all"}) {
      size_t at = t.find(name);
      while (at != std::string::npos && !shm) {
        bool start = at == 0 || t[at - 1] == ',' || t[at - 1] == '^';
        size_t end = at + std::string(name).size();
        shm = start && (end == t.size() || t[end] == ',');
        at = t.find(name, at + 1);
      }
    }
    impl->tls_restricted_to_tcp(t, shm);
  }
  ucp_config_t* cfg = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &cfg);
  if (st != UCS_OK) return std::unexpected(ucx_error(DataErrc::kUnavailable, "ucp_config_read", st));
  // DA-21: the environment's choice wins; else the devices the caller named.
  if (const char* env = std::getenv("UCX_NET_DEVICES"); env != nullptr && *env != '\0') {
    impl->net_devices = env;
  } else if (!config.net_devices.empty()) {
    st = ucp_config_modify(cfg, "NET_DEVICES", config.net_devices.c_str());
    if (st != UCS_OK) {
      ucp_config_release(cfg);
      return std::unexpected(ucx_error(
          DataErrc::kUnavailable, "UCX refused NET_DEVICES=" + config.net_devices, st));
    }
    impl->net_devices = config.net_devices;
  }
  // DA-22: UCX's TCP segments, large unless the environment sets them (see engine.h). The
  // names are the tcp transport's own (UCX applies them to every transport that has them);
  // set only where tcp may run, since UCX warns about options no transport takes.
  const char* tls_env = std::getenv("UCX_TLS");
  std::string tls = tls_env ? tls_env : "";
  if (tls.empty() || tls[0] == '^' || tls.find("tcp") != std::string::npos ||
      tls.find("all") != std::string::npos) {
    for (const auto& [name, value] : kTcpSegDefaults) {
      if (std::getenv(("UCX_TCP_" + std::string(name)).c_str()) == nullptr) {
        ucp_config_modify(cfg, name, value);
      }
    }
  }
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES;
  p.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  st = ucp_init(&p, cfg, &impl->ctx);
  ucp_config_release(cfg);
  if (st != UCS_OK) return std::unexpected(ucx_error(DataErrc::kUnavailable, "ucp_init", st));
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(impl->ctx, &wp, &impl->worker);
  if (st != UCS_OK) return std::unexpected(ucx_error(DataErrc::kUnavailable, "ucp_worker_create", st));
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  st = ucp_worker_get_address(impl->worker, &addr, &len);
  if (st != UCS_OK) {
    return std::unexpected(ucx_error(DataErrc::kUnavailable, "ucp_worker_get_address", st));
  }
  impl->address.assign(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(impl->worker, addr);
  if (ucp_worker_get_efd(impl->worker, &impl->efd) != UCS_OK) impl->efd = -1;
  impl->cma_enabled = cma_allowed();
  impl->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->wake_fd < 0) return std::unexpected(errno_error("eventfd", errno));
  impl->progress = std::thread([raw = impl.get()] { raw->run(); });
  for (size_t i = 1; i < config.copiers; ++i) {
    impl->copy_threads.emplace_back([raw = impl.get()] { raw->copy_loop(); });
  }
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

namespace {
std::once_flag g_instance_once;
Engine* g_instance = nullptr;
Error* g_instance_error = nullptr;

void stop_instance() {
  if (g_instance) g_instance->stop();
}
}  // namespace

Result<Engine*> Engine::instance(std::string_view net_devices) {
  std::call_once(g_instance_once, [net_devices] {
    auto env = [](const char* name, long long low, long long high, auto fallback) {
      const char* c = std::getenv(name);
      long long v = c ? std::atoll(c) : 0;
      return c && v >= low ? static_cast<decltype(fallback)>(std::min(v, high)) : fallback;
    };
    EngineConfig config;
    config.net_devices = std::string(net_devices);
    config.chunk_bytes = env("PODIUM_RDMA_CHUNK_BYTES", 1, 1LL << 40, config.chunk_bytes);
    config.nice = env("PODIUM_RDMA_NICE", 0, 19, config.nice);
    config.copiers = env("PODIUM_RDMA_CMA_THREADS", 1, 16, config.copiers);  // DA-11
    auto e = make(config);
    if (!e) {
      g_instance_error = new Error(e.error());
      return;
    }
    // Intentionally leaked: registrations may outlive any static destructor. Its thread is
    // joined at exit, before UCX's own library destructors run.
    g_instance = e->release();
    std::atexit(stop_instance);
  });
  if (g_instance) return g_instance;
  return std::unexpected(*g_instance_error);
}

const std::string& Engine::address() const { return impl_->address; }

const std::string& Engine::net_devices() const { return impl_->net_devices; }

Result<std::shared_ptr<Registration>> Engine::register_memory(const void* addr, size_t size,
                                                                std::shared_ptr<const void> keep) {
  if (addr == nullptr || size == 0) {
    return std::unexpected(
        make_error(DataErrc::kInvalidArgument, "cannot register an empty region"));
  }
  std::lock_guard lock(impl_->mu);
  auto key = std::make_pair(reinterpret_cast<uint64_t>(addr), size);
  auto it = impl_->regs.find(key);
  if (it != impl_->regs.end()) {
    if (auto r = it->second.lock()) return r;  // DA-2
  }
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = const_cast<void*>(addr);
  mp.length = size;
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(impl_->ctx, &mp, &memh);
  if (st != UCS_OK) {
    return std::unexpected(ucx_error(DataErrc::kUnavailable,
                                     "ucp_mem_map of " + human_bytes(size), st));
  }
  void* packed = nullptr;
  size_t packed_len = 0;
  st = ucp_rkey_pack(impl_->ctx, memh, &packed, &packed_len);
  if (st != UCS_OK) {
    ucp_mem_unmap(impl_->ctx, memh);
    return std::unexpected(ucx_error(DataErrc::kUnavailable, "ucp_rkey_pack", st));
  }
  std::shared_ptr<Registration> r(new Registration());
  r->rkey_.assign(static_cast<const char*>(packed), packed_len);
  ucp_rkey_buffer_release(packed);
  r->engine_ = impl_;
  r->memh_ = memh;
  r->addr_ = key.first;
  r->size_ = size;
  r->keep_ = std::move(keep);
  impl_->regs[key] = r;
  ++impl_->live_regs;
  return r;
}

size_t Engine::registration_count() const {
  std::lock_guard lock(impl_->mu);
  return impl_->live_regs;
}

actor::Future<void> Engine::submit(std::vector<Op> ops, std::chrono::nanoseconds timeout) {
  auto t = std::make_shared<Transfer>();
  auto fut = t->promise.future();
  std::vector<std::pair<actor::Promise<void>, Status>> ready;
  {
    std::lock_guard lock(impl_->mu);
    auto& m = *impl_;
    ++m.stats.transfers;
    t->timeout = timeout;
    t->deadline = Clock::now() + timeout;
    t->ops_left = ops.size();
    t->ops.reserve(ops.size());
    for (auto& op : ops) t->ops.push_back(OpState{std::move(op)});
    if (m.stopping) {
      m.settle(t, std::unexpected(make_error(DataErrc::kStopped, "the data plane was stopped")));
    } else if (timeout <= std::chrono::nanoseconds::zero() && !t->ops.empty()) {
      // DA-5: no time left, nothing is posted.
      ++m.stats.timeouts;
      m.settle(t, std::unexpected(make_error(
                      DataErrc::kTimeout, "transfer of " + std::to_string(t->ops.size()) +
                                              " operation(s) had no time left; nothing was posted")));
    }
    for (size_t i = 0; i < t->ops.size() && !t->settled; ++i) {
      auto& o = t->ops[i];
      if (m.cma_enabled && o.op.same_host && o.op.peer_pid > 0) {
        o.cma = true;  // DA-10
        continue;
      }
      auto ep = m.endpoint(o.op.peer, o.op.same_host);
      if (!ep) {
        m.settle(t, std::unexpected(ep.error()));
        break;
      }
      o.ep = *ep;
      ++o.ep->users;
      ucs_status_t st = ucp_ep_rkey_unpack(o.ep->ep, o.op.rkey.data(), &o.rkey);
      if (st != UCS_OK) {
        o.rkey = nullptr;
        m.settle(t, std::unexpected(ucx_error(DataErrc::kInvalidArgument, "ucp_ep_rkey_unpack", st)));
      }
    }
    m.active.insert(t);
    m.stats.active = m.active.size();
    if (t->ops.empty()) m.settle(t, {});
    for (size_t i = 0; i < t->ops.size() && !t->settled; ++i) {
      if (!t->ops[i].cma) {
        m.pump(t, i);
      } else if (t->ops[i].op.size == 0) {
        m.op_done(t, i);
      } else {
        m.cma_ops.emplace_back(t, i);
      }
    }
    if (!m.cma_ops.empty()) m.cma_cv.notify_all();  // DA-11
    m.maybe_retire(t);
    ready.swap(m.fire);
  }
  impl_->fire_all(ready);
  impl_->wake();
  return fut;
}

Engine::Stats Engine::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->stats;
}

void Engine::stop() {
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->stopping) return;
    impl_->stopping = true;
  }
  impl_->wake();
  impl_->cma_cv.notify_all();
  if (impl_->progress.joinable()) impl_->progress.join();
  for (auto& c : impl_->copy_threads) c.join();
  impl_->copy_threads.clear();
  std::vector<std::pair<actor::Promise<void>, Status>> ready;
  {
    std::lock_guard lock(impl_->mu);
    auto& m = *impl_;
    m.cma_ops.clear();
    std::vector<std::shared_ptr<Transfer>> left(m.active.begin(), m.active.end());
    for (const auto& t : left) {
      m.settle(t, std::unexpected(make_error(DataErrc::kStopped, "the data plane was stopped")));
    }
    while (!m.eps.empty()) m.close_ep(m.eps.begin());
    // Bounded: a close that UCX cannot finish is abandoned with the worker.
    for (int i = 0; i < 1000 && !m.closing.empty(); ++i) {
      while (ucp_worker_progress(m.worker) != 0) {
      }
      m.sweep_closing();
      if (!m.closing.empty()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    ready.swap(m.fire);
  }
  impl_->fire_all(ready);
}

}  // namespace podium::data
