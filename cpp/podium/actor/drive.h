// podium::actor drive — which thread runs a proc's mailboxes, and the per-thread state that
// decides it.
//
// A mailbox is drained by a runner of the proc's Executor (executor.h), or by one of two other
// kinds of thread:
//   - a thread outside the runtime that sent a call and then blocks on its answer with no
//     timeout (Signal::wait) runs the mailbox it scheduled last itself (help_while_waiting):
//     a local call then costs no thread hop;
//   - a runner that delivers a batch of envelopes from the channel runs the first mailbox the
//     batch made ready right after the batch (Net::on_batch_end) instead of posting it.
// A thread that drives the loop for one actor's next message (a Python actor's thread) runs
// message deliveries only, inside a DeliveryOnlyScope (AC-10).
//
// Every thread_local of the actor layer lives in DriveTls below, written only by its own
// thread:
//   actor, actor_text, actor_stream   the actor whose handler runs here (drain; AC-11's stream)
//   batch_proc, batch_cell            the channel batch being delivered and its first mailbox
//   delivery_only, deferred           DeliveryOnlyScope, and whether a drain left work
//   help, helping                     the mailbox this thread may help with; the gate it is in
//   dest_text, dest_addr              Proc::send's last parsed destination address
//
// Threads: HelpGate is thread-safe. The rest is per thread.
// Invariants:
//   AC-17 A thread that helps (help_while_waiting) runs a proc's mailbox only inside that
//        proc's HelpGate: Proc::stop() (and so ~Proc) closes the gate and waits until no other
//        thread helps, so a Proc destroyed while a thread helps is never touched after its
//        end; a help that comes after the close does nothing. A thread that stops the proc
//        from inside its own help does not wait for itself.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "podium/actor/ids.h"
#include "podium/channel/address.h"

namespace podium::actor {

// The actor whose handler is running on this thread, or nullptr.
const ActorId* current_actor();
// Its text form (cached: no formatting per message), or nullptr.
const std::string* current_actor_text();

// A thread that drives the loop while it waits for one actor's next message (a Python
// actor's thread) runs message deliveries only: constructs and stops wait for other threads
// (the spawner, an actor's thread, possibly this very one), so while a DeliveryOnlyScope
// lives on a thread, a drain there that reaches one leaves it queued for another thread and
// sets deferred(), and the driver steps out of the loop so that a runner takes over. AC-10.
class DeliveryOnlyScope {
 public:
  DeliveryOnlyScope();
  ~DeliveryOnlyScope();
  DeliveryOnlyScope(const DeliveryOnlyScope&) = delete;
  DeliveryOnlyScope& operator=(const DeliveryOnlyScope&) = delete;
  // A drain on this thread left a construct or a stop for another thread.
  static bool deferred();

 private:
  bool outer_active_;
  bool outer_deferred_;
};

// A thread outside the runtime that is about to block with no timeout runs the mailbox it
// scheduled last, if no runner has started it yet: a local call then costs no thread hop.
// Called by Signal::wait(); does nothing on runner threads. AC-17.
void help_while_waiting();

namespace internal {

// AC-17: counts the threads helping one proc; Proc::stop() closes it.
class HelpGate {
 public:
  bool enter();  // false once closed
  void leave();
  // Refuses new helpers and waits for the ones inside, but the calling thread's own help.
  void close_and_wait();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int active_ = 0;
  bool closed_ = false;
};

// Runs one mailbox's queued items (Proc::Impl::drain), for a helper.
using DrainFn = void (*)(void* impl, const std::shared_ptr<void>& mailbox);

struct HelpCandidate {
  std::weak_ptr<HelpGate> gate;  // the proc's; expired or closed once it stopped
  void* impl = nullptr;          // valid while inside the gate
  DrainFn drain = nullptr;
  std::weak_ptr<void> mailbox;
};

struct DriveTls {
  const ActorId* actor = nullptr;
  const std::string* actor_text = nullptr;
  uint64_t actor_stream = 0;
  const void* batch_proc = nullptr;
  std::shared_ptr<void> batch_cell;
  bool delivery_only = false;
  bool deferred = false;
  HelpCandidate help;
  const HelpGate* helping = nullptr;
  std::string dest_text;
  channel::Address dest_addr;
};

DriveTls& drive_tls();

// Sets the current actor (and its ordering stream) for a drain's lifetime.
class ActorScope {
 public:
  ActorScope(const ActorId* id, const std::string* text, uint64_t stream);
  ~ActorScope();
  ActorScope(const ActorScope&) = delete;
  ActorScope& operator=(const ActorScope&) = delete;

 private:
  DriveTls& tls_;
  const ActorId* outer_;
  const std::string* outer_text_;
  uint64_t outer_stream_;
};

}  // namespace internal
}  // namespace podium::actor
