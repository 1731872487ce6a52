// podium::actor::PortReceiver — the receiving end of a port: a port of a Proc whose handler
// queues every message, handed out in arrival order by recv() as futures.
//
//   actor::PortReceiver rx(proc, /*once=*/false);
//   send_to_somebody(rx.port_id());               // a PortId text, for Port::send or a cast
//   auto first = rx.recv().get();                  // Result<std::vector<Buffer>>
//   actor::send_to_port(other_proc, port_id, {Buffer::copy_of("hi")});   // the sender's side
//
// A message is a kPort (its parts are the value) or a kReply (an endpoint's answer when the
// port was the reply port of a cast or call: its value, or the error the endpoint raised).
//
// Threads: every member is thread-safe. The port's handler runs on the delivering thread (a
// Proc's I/O or runner thread); it completes waiting futures there, so their on_ready
// callbacks run on that thread and must not block (future.h).
// Invariants:
//   PQ-1 recv() futures resolve in call order with the messages in arrival order: the k-th
//        recv() gets the k-th message the port received, whichever came first.
//   PQ-2 After close() (or the destructor) the port is closed: a pending recv() fails with
//        kNoSuchPort naming the port, a later recv() too, and later messages are dropped by
//        the Proc as for any closed port. A once-receiver's port closes after one message;
//        the message is still handed out.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "podium/actor/future.h"
#include "podium/actor/ids.h"
#include "podium/base/buffer.h"

namespace podium::actor {

class Proc;

class PortReceiver {
 public:
  // Opens a port of `proc`, which must outlive this receiver. `once`: the port closes after
  // its first message.
  PortReceiver(Proc& proc, bool once);
  ~PortReceiver();
  PortReceiver(const PortReceiver&) = delete;
  PortReceiver& operator=(const PortReceiver&) = delete;

  const PortId& port() const { return port_; }
  // The port's PortId text: where senders address it.
  std::string port_id() const { return port_.to_string(); }

  // The next message (PQ-1): its value parts, or the error a reply carried; kNoSuchPort once
  // closed (PQ-2).
  Future<std::vector<Buffer>> recv();

  // Closes the port; pending recv() futures fail (PQ-2). Idempotent.
  void close();

 private:
  struct State {
    std::mutex mu;  // guards everything below
    std::deque<Result<std::vector<Buffer>>> items;
    std::deque<Promise<std::vector<Buffer>>> waiters;
    bool closed = false;
  };
  static void deliver(State& st, Result<std::vector<Buffer>> message);

  Proc& proc_;
  std::shared_ptr<State> st_;  // shared with the port's handler
  PortId port_;
};

// Sends `parts` from `from` to the port `port` (a PortId text) as a kPort message: one-way,
// in order per sender (AC-11); to a closed port it is undeliverable (AC-8: the hook is told).
void send_to_port(Proc& from, std::string port, std::vector<Buffer> parts);

}  // namespace podium::actor
