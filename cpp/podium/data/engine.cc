// podium::data::Engine (engine.h): chunked one-sided transfers, the progress and copy threads
// (their loops are Engine::Impl's, engine_impl.h). The context, the worker and registration are
// in engine_setup.cc.
#include "podium/data/engine_impl.h"

namespace podium::data {

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


// DA-31: what a same-host operation costs the caller to copy (shared pages at memcpy speed,
// CMA about 4 times slower, except the partial pages at a window's ends: one system call).
static uint64_t caller_cost(const Op& o) {
  if (!o.window) return 4 * uint64_t{o.size};
  const auto& w = o.window->ref();
  uint64_t lo = o.remote_addr, hi = lo + o.size;
  uint64_t b = std::max(lo, w.begin), e = std::min(hi, w.end);
  if (b >= e) return 4 * uint64_t{o.size};
  uint64_t edges = (b - lo) + (hi - e);
  return (e - b) + (edges <= 2 * uint64_t{shm::page_size()} ? 0 : 4 * edges);
}

actor::Future<void> Engine::submit(std::vector<Op> ops, std::chrono::nanoseconds timeout,
                                   bool caller_copies) {
  auto t = std::make_shared<Transfer>();
  auto fut = t->promise.future();
  std::vector<std::pair<actor::Promise<void>, Status>> ready;
  std::vector<CmaJob> mine;  // DA-31: copied below, by this thread
  std::vector<size_t> shared;  // DA-37: ops whose chunks this thread takes with the copiers
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
      if (m.cma_enabled && o.op.same_host && o.op.peer_pid > 0 &&
          o.op.local_memory == Memory::kHost && o.op.remote_memory == Memory::kHost) {
        o.cma = true;  // DA-10
        if (o.op.sum && o.op.kind == Op::Kind::kGet) o.op.sum->taken = true;  // DA-44
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
    if (caller_copies && !t->settled) {
      uint64_t cost = 0;
      for (const auto& o : t->ops) cost = o.cma ? cost + caller_cost(o.op) : kCallerCopyBytes + 1;
      caller_copies = cost <= kCallerCopyBytes;
    }
    for (size_t i = 0; i < t->ops.size() && !t->settled; ++i) {
      auto& o = t->ops[i];
      if (!o.cma) {
        m.pump(t, i);
      } else if (o.op.size == 0) {
        m.op_done(t, i);
      } else if (caller_copies && m.config.copiers > 1 && o.op.size >= 2 * kMinCmaChunk) {
        shared.push_back(i);  // DA-37: offered to the copiers, and copied here as well
        m.cma_ops.emplace_back(t, i);
      } else if (caller_copies) {  // DA-31: the whole operation, as one job, taken here
        mine.push_back(CmaJob{t, i, 0, o.op.size});
        o.next = o.op.size;
        ++o.inflight;
        ++t->outstanding;
        ++m.stats.chunks;
      } else {
        m.cma_ops.emplace_back(t, i);
      }
    }
    if (!mine.empty() || !shared.empty()) ++m.stats.caller_copied;
    if (!m.cma_ops.empty()) m.cma_cv.notify_all();  // DA-11
    m.maybe_retire(t);
    ready.swap(m.fire);
  }
  impl_->fire_all(ready);
  if (!shared.empty()) impl_->wake();  // the progress thread copies chunks too (DA-11)
  for (auto& job : mine) {  // DA-31: outside the lock, as the copiers copy
    int err = copy_job(job);
    std::lock_guard lock(impl_->mu);
    impl_->finish_cma_job(job, err);
    ready.swap(impl_->fire);
  }
  impl_->fire_all(ready);
  for (size_t i : shared) {  // DA-37: chunk by chunk, until the copiers have taken the rest
    for (;;) {
      CmaJob job;
      {
        std::lock_guard lock(impl_->mu);
        if (!impl_->take_cma_chunk_of(t, i, job)) break;
      }
      int err = copy_job(job);
      {
        std::lock_guard lock(impl_->mu);
        impl_->finish_cma_job(job, err);
        ready.swap(impl_->fire);
      }
      impl_->fire_all(ready);
    }
  }
  if (mine.empty() && shared.empty()) impl_->wake();
  return fut;
}

std::optional<int> Engine::copy_now(const Op& op, uint64_t* sum) {
  {
    std::lock_guard lock(impl_->mu);
    const auto& m = *impl_;
    if (m.stopping || !m.cma_enabled || !op.same_host || op.peer_pid <= 0 || op.size == 0 ||
        op.local_memory != Memory::kHost || op.remote_memory != Memory::kHost ||
        caller_cost(op) > kCallerCopyBytes ||
        (m.config.copiers > 1 && op.size >= 2 * kMinCmaChunk)) {  // DA-37 shares it
      return std::nullopt;
    }
  }
  uint64_t window = 0;
  int err = cma::copy(op, 0, op.size, &window, sum);
  if (err == 0) {
    std::lock_guard lock(impl_->mu);
    auto& st = impl_->stats;
    ++st.transfers;
    ++st.caller_copied;
    ++st.chunks;
    st.bytes += op.size;
    st.window_bytes += window;
  }
  return err;
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
