// Internal to podium_channel: the inproc transport, for Nets of one process.
//
// A listening Net registers its name in a process-wide registry. A sending link attaches a
// Pipe to the destination: a queue the sender appends to and the destination drains on its
// own io_context. At most one drain per pipe is scheduled at a time and it delivers in
// queue order, so CH-1 and CH-4 hold however many threads run the destination's io_context;
// DeliverFn never runs on the sender's thread.
//
// An envelope leaves the sender's queue when it enters the pipe and is delivered unless the
// destination stops first; then the sender hands it back with kCancelled. There is no
// connection to lose, so reset_connections_for_test() does not touch inproc links.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "podium/channel/link.h"

namespace podium::channel::internal {

class InprocLink;

struct Pipe {
  std::shared_ptr<Core> receiver;
  std::weak_ptr<InprocLink> sender;

  std::mutex mu;
  // Guarded by mu:
  Fifo<Outgoing> queue;
  bool drain_posted = false;  // a drain() is posted or running
  bool closed = false;        // either end stopped: nothing more is delivered
};

// A Net's registered inproc name.
class InprocListener final : public ListenerBase {
 public:
  // Registers `name` for `core`; fails when a live listener has it.
  [[nodiscard]] static Result<std::shared_ptr<InprocListener>> listen(std::shared_ptr<Core> core,
                                                                     const std::string& name);
  // Unregisters the name and closes every pipe: their senders hand the rest back.
  void close() override;

 private:
  friend class InprocLink;
  InprocListener(std::shared_ptr<Core> core, std::string name)
      : core_(std::move(core)), name_(std::move(name)) {}
  // A new pipe from `sender`, or null once closed.
  std::shared_ptr<Pipe> attach(const std::shared_ptr<InprocLink>& sender);

  const std::shared_ptr<Core> core_;
  const std::string name_;
  std::mutex mu_;
  // Guarded by mu_:
  bool closed_ = false;
  std::vector<std::weak_ptr<Pipe>> pipes_;
};

class InprocLink final : public Link {
 public:
  using Link::Link;
  // The destination closed `pipe`: hand back what it still holds.
  void on_pipe_closed(const std::shared_ptr<Pipe>& pipe);

 private:
  void connect_locked() override;
  void push_locked() override;
  void close_locked() override {}
  void take_in_flight_locked(std::vector<Outgoing>& out) override;
  size_t in_flight_locked() override;
  // Closes `p` and moves what it still holds to returned_.
  void reclaim_locked(Pipe& p);

  // Guarded by mu_:
  std::shared_ptr<Pipe> pipe_;
  std::vector<Outgoing> returned_;  // reclaimed from a closed pipe, to be handed back
};

}  // namespace podium::channel::internal
