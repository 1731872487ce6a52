// podium::mesh::Relay — the cast tree (docs/cast.md). Every process's runtime runs one: it
// starts the casts this process sends to more actors than the fan-out, and serves the "cast"
// system operation through which other processes hand it a subtree.
//
// A cast to ranks [0, n) with fan-out k splits [0, n) into at most k contiguous chunks of
// near-equal size and sends each chunk to the proc of its first rank. A node that receives
// chunk [lo, hi) delivers the call to rank lo (an actor of its own proc), forwards [lo+1, hi)
// split the same way, and gathers the replies of its chunk into one message to its parent. A
// chunk names its ranks' PortIds and AC-11 numbers as runs (cast_plan.h) and a node keeps its
// answered ranks as ranges, so a relay's work is O(runs), not O(ranks in its subtree).
//
// Threads: every member is thread-safe; handlers run on the delivering thread and never block.
// Invariants:
//   CT-1 The sender of a cast to n > k ranks sends k "cast" messages and receives at most k
//        replies, whatever n is (plus one per child proc that dies, CT-4). One-way casts
//        gather too (empty acks), so that CT-4 holds for them.
//   CT-2 The tree is a function of (n, k) alone: every node can compute any subtree's shape.
//   CT-3 A node answers its parent once, with the reply of every rank of its chunk in rank
//        order, runs of byte-equal replies sent once (docs/cast.md, "Reduced replies").
//   CT-4 A node whose child's proc exits (ME-7) fails that child's rank with the exit cause and
//        sends the child's own children their chunks itself. A node that receives a chunk a
//        second time (same cast id) delivers nothing twice: it answers the new parent too
//        (every parent not known dead; at once if it has finished). Calls carry AC-11 sequence numbers, so a call re-sent down
//        another path is dropped by its receiver if the first copy arrived.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "podium/base/buffer.h"
#include "podium/actor/message.h"
#include "podium/mesh/cast.h"
#include "podium/mesh/cast_plan.h"

namespace podium::mesh {

// Fan-out of casts started from this process: PODIUM_CAST_FANOUT, default 16. 0 (or a cast
// to at most `fanout` ranks) sends one message per actor from the sender (the star).
size_t cast_fanout();
void set_cast_fanout(size_t k);
inline constexpr size_t kDefaultCastFanout = 16;

// The chunks that [lo, hi) is split into for k children (CT-2); Chunk is in cast.h.
std::vector<Chunk> split_chunks(size_t lo, size_t hi, size_t k);

// What every node of one cast needs: which actors, in rank order, and what to call.
struct CastPlan {
  uint64_t id = 0;       // unique per cast (the starting process's random base + a counter)
  size_t fanout = kDefaultCastFanout;
  std::string endpoint;
  std::string sender;    // the calling actor's id text, or empty
  uint64_t stream = 0;   // AC-11 stream of the sender
  std::vector<std::string> labels;  // the cast region's extent
  std::vector<size_t> sizes;
  // Of each rank of the plan (the whole cast at the root, a chunk at a relay), as runs
  // (cast_plan.h): its mailbox PortId and the AC-11 number of its call.
  PortRuns ports;
  SeqRuns seqs;
  std::vector<Buffer> args;
  bool want_reply = true;
  // One-way casts: where every actor answers itself (a port cast, cast.h CS-1); empty: nowhere.
  std::string reply_to;
};

class Relay;

// Receives replies as ranges of ranks [lo, hi) that all answered `reply`.
using RangeSink = std::function<void(size_t lo, size_t hi, const Reply& reply)>;

// Starts a cast tree from this process (assigns plan->id). `sink` receives every rank's reply
// (ranges in any order, each rank at most once); nothing when plan.want_reply is false.
// `done`, when valid, is the future whose completion ends the cast here (the caller's
// collector).
void start_tree_cast(Relay& relay, std::shared_ptr<CastPlan> plan, RangeSink sink,
                     actor::Future<Replies> done);

class Relay {
 public:
  Relay();
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  // The "cast" system operation (header and envelope as the proc layer passes them).
  void on_cast(const actor::SystemHeader& h, wire::Envelope&& env);
  // A proc exited (ME-7): nodes waiting on it adopt its children (CT-4).
  void proc_gone(const std::string& proc_key, const Error& why);

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace podium::mesh
