// podium::actor ordering — AC-11's two ends: the sender's sequence numbers and the receiver's
// hold-back of calls that arrive early.
//
// SeqCounters (sender side) gives each (stream, destination text) pair its next number; a
// Proc stamps every call it sends with one (proc.h: sender_stream(), next_seq()). OrderedInbox
// (receiver side) hands the calls of each (stream, destination) to the proc's router in that
// order: it holds back a call that arrived early, drops a duplicate, and skips a gap that
// stays unfilled for the gap timeout (a Timer on the injected clock: base/clock.h), so one
// lost message never stalls a stream. Both are free of Proc, so a test drives them alone with
// a ManualClock (ordering_test.cc).
//
// Threads: every public member of both is thread-safe. OrderedInbox calls its Deliver outside
// its lock, one thread at a time per stream (which keeps the order), on the thread that
// completed the stream's next number, or on the thread that runs the gap timer (an io_context
// thread, or a ManualClock's advance()).
// Invariants (AC-11 is stated in proc.h):
//   AC-16 The receiver forgets the streams of a sending process once the proc layer is told
//        that process ended (Proc::forget_dests, Proc::forget_peer): its held calls, its
//        counters and its gap timer go, so a long-lived proc keeps ordering state only for
//        senders that can still send. A sender names its process in every call it stamps
//        (Envelope::sender: its actor, or the proc itself); a stream whose calls name no
//        sender is kept. The sender side's counters of an actor of this proc go when that
//        actor ends: each actor incarnation sends on a stream of its own, so a respawned
//        actor of the same name starts a new stream rather than reuse the old numbers.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "podium/base/clock.h"
#include "podium/wire/envelope.h"

namespace podium::base {
class Timer;
}

namespace podium::actor {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// The counters behind SeqCounters::next_seqs() for a list of dests (Proc::SeqSlots).
struct SeqSlots {
  std::vector<uint64_t*> slots;                     // by dest
  std::vector<std::shared_ptr<uint64_t[]>> blocks;  // what `slots` point into
};

// The sender side: stream -> dest -> the last number given.
class SeqCounters {
 public:
  // The next numbers of every dest in `dests` (out[i] for dests[i]), under one lock; with
  // `dests` empty, of `one` into out[0].
  void next_seqs(uint64_t stream, std::span<const std::string* const> dests,
                 std::string_view one, uint64_t* out);
  void next_seqs(std::span<uint64_t* const> slots, uint64_t* out);
  // The dests it meets first get one contiguous block, in their order, so that a cast to a
  // mesh walks its counters in memory order. A block lives while a dest in it is here or a
  // SeqSlots holds it.
  SeqSlots seq_slots(uint64_t stream, std::span<const std::string* const> dests);
  // Drops the counters of every dest on the procs `proc_keys` ("<proc>#<actor>:<port>").
  void forget_dests(std::span<const std::string> proc_keys);
  // Drops every counter of `stream` (its sender ended: AC-16).
  void forget_stream(uint64_t stream);
  size_t stream_count() const;  // tests

 private:
  struct Counter {
    uint64_t* value;
    std::shared_ptr<uint64_t[]> block;
  };
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, StringMap<Counter>> out_;
};

// The receiver side.
class OrderedInbox {
 public:
  using Deliver = std::function<void(wire::Envelope&&)>;

  // `deliver` routes a call once its turn came. Timers run on `io` (or in `clock`'s
  // advance() when it is a ManualClock).
  OrderedInbox(asio::io_context& io, std::shared_ptr<base::Clock> clock,
               std::chrono::nanoseconds gap_timeout, Deliver deliver);
  ~OrderedInbox();
  OrderedInbox(const OrderedInbox&) = delete;
  OrderedInbox& operator=(const OrderedInbox&) = delete;

  // Takes a stamped call (order_stream != 0) and delivers it, and any it completes, in order.
  void route(wire::Envelope&& env);
  // AC-16: the processes `proc_keys` (ProcId texts) ended; their streams go.
  void forget_senders(std::span<const std::string> proc_keys);
  size_t stream_count() const;  // tests
  size_t held_count() const;    // calls held back, all streams (tests)

 private:
  struct Stream {
    uint64_t next = 1;                         // the next number to deliver
    std::map<uint64_t, wire::Envelope> early;  // arrived ahead of `next`
    std::deque<wire::Envelope> ready;          // in order, for the delivering thread
    bool delivering = false;                   // a thread is routing `ready`
    std::unique_ptr<base::Timer> gap_timer;    // armed while `early` waits
    uint64_t gap_at = 0;                       // `next` when the timer was armed
    std::string sender_proc;                   // who sends on it, "" when unknown (AC-16)
  };
  static void release_early(Stream& s);
  void deliver_ready(std::unique_lock<std::mutex>& lock, Stream& s);
  void arm_gap_timer(const std::string& key, Stream& s);
  void on_gap_timeout(const std::string& key);

  asio::io_context& io_;
  const std::shared_ptr<base::Clock> clock_;
  const std::chrono::nanoseconds gap_timeout_;
  const Deliver deliver_;
  // Lets a gap timer's handler tell that the inbox is gone (it may run after the destructor,
  // with operation_aborted, on an io_context thread).
  const std::shared_ptr<int> life_ = std::make_shared<int>(0);
  mutable std::mutex mu_;  // guards streams_ and every Stream
  // "<stream> <dest>". Node-based: a Stream reference outlives later inserts.
  std::unordered_map<std::string, Stream> streams_;
};

// The process part of a sender or dest text: "<proc>" of "<proc>#<actor>[:<port>]".
std::string_view proc_of(std::string_view text);

}  // namespace podium::actor
