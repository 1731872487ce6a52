#include "podium/channel/inproc.h"

#include <asio/post.hpp>
#include <unordered_map>

namespace podium::channel::internal {
namespace {

// Deliveries per drain() run before it re-posts itself, so that one busy sender does not
// hold an io_context thread.
constexpr int kDrainBatch = 256;

struct Registry {
  std::mutex mu;
  std::unordered_map<std::string, std::weak_ptr<InprocListener>> names;  // guarded by mu
};

Registry& registry() {
  static auto* r = new Registry;  // never destroyed: Nets may outlive static destruction
  return *r;
}

// Runs on the destination's io_context; only one runs per pipe at a time (drain_posted).
void drain(const std::shared_ptr<Pipe>& p) {
  Core& core = *p->receiver;
  Gate::Scope gate(core.gate);
  BatchEnd batch{core};
  for (int n = 0;; ++n) {
    Outgoing o;
    {
      std::lock_guard lock(p->mu);
      if (!gate || p->closed || p->queue.empty()) {
        p->drain_posted = false;
        return;
      }
      if (n == kDrainBatch) {
        asio::post(core.io, [p] { drain(p); });
        return;
      }
      o = p->queue.pop_front();
    }
    batch.delivered = true;
    core.deliver(std::move(o.env));
  }
}

}  // namespace

Result<std::shared_ptr<InprocListener>> InprocListener::listen(std::shared_ptr<Core> core,
                                                               const std::string& name) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto& slot = r.names[name];
  if (!slot.expired()) {
    return std::unexpected(
        make_error(ChannelErrc::kListenFailed, "inproc:" + name + " already has a listener"));
  }
  std::shared_ptr<InprocListener> l(new InprocListener(std::move(core), name));
  slot = l;
  return l;
}

void InprocListener::close() {
  {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    if (auto it = r.names.find(name_); it != r.names.end() && it->second.lock().get() == this) {
      r.names.erase(it);
    }
  }
  std::vector<std::weak_ptr<Pipe>> pipes;
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = true;
    pipes.swap(pipes_);
  }
  for (const auto& weak : pipes) {
    auto p = weak.lock();
    if (!p) continue;
    {
      std::lock_guard lock(p->mu);
      p->closed = true;
    }
    if (auto sender = p->sender.lock()) {
      asio::post(sender->io(), [sender, p] { sender->on_pipe_closed(p); });
    }
  }
}

std::shared_ptr<Pipe> InprocListener::attach(const std::shared_ptr<InprocLink>& sender) {
  std::lock_guard lock(mu_);
  if (closed_) return nullptr;
  auto p = std::make_shared<Pipe>();
  p->receiver = core_;
  p->sender = sender;
  std::erase_if(pipes_, [](const std::weak_ptr<Pipe>& w) { return w.expired(); });
  pipes_.push_back(p);
  return p;
}

void InprocLink::connect_locked() {
  std::shared_ptr<InprocListener> listener;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    if (auto it = r.names.find(to_.target); it != r.names.end()) listener = it->second.lock();
  }
  if (listener) pipe_ = listener->attach(std::static_pointer_cast<InprocLink>(shared_from_this()));
  if (!pipe_) {
    failed_locked("no listener at " + to_text_);
    return;
  }
  state_ = State::kConnected;
  last_error_.clear();
  push_locked();
}

void InprocLink::push_locked() {
  std::unique_lock lock(pipe_->mu);
  if (pipe_->closed) {
    // The destination is stopping; its close() has posted on_pipe_closed(), which hands
    // back what the pipe holds. What is still in queue_ waits for a new listener.
    lock.unlock();
    reclaim_locked(*pipe_);
    pipe_.reset();
    failed_locked(to_text_ + " stopped");
    return;
  }
  while (!queue_.empty()) pipe_->queue.push_back(queue_.pop_front());
  if (!pipe_->drain_posted) {
    pipe_->drain_posted = true;
    asio::post(pipe_->receiver->io, [p = pipe_] { drain(p); });
  }
}

void InprocLink::reclaim_locked(Pipe& p) {
  std::lock_guard lock(p.mu);
  p.closed = true;
  p.queue.drain_into(returned_);
}

void InprocLink::take_in_flight_locked(std::vector<Outgoing>& out) {
  if (pipe_) reclaim_locked(*pipe_);
  pipe_.reset();
  for (auto& o : returned_) out.push_back(std::move(o));
  returned_.clear();
}

size_t InprocLink::in_flight_locked() {
  size_t n = returned_.size();
  if (pipe_) {
    std::lock_guard lock(pipe_->mu);
    n += pipe_->queue.size();
  }
  return n;
}

void InprocLink::on_pipe_closed(const std::shared_ptr<Pipe>& pipe) {
  Gate::Scope gate(core_->gate);
  if (!gate) return;  // stopping: stop() hands back pipe_ and returned_
  std::vector<Outgoing> back;
  {
    std::lock_guard lock(mu_);
    reclaim_locked(*pipe);
    if (pipe_ == pipe) {
      pipe_.reset();
      if (state_ == State::kConnected) failed_locked(to_text_ + " stopped");
    }
    back.swap(returned_);
  }
  hand_back(*core_, back, ChannelErrc::kCancelled, to_text_ + " stopped before delivering");
}

}  // namespace podium::channel::internal
