// Untyped casts: one endpoint call sent to every actor of a mesh region, replies gathered by
// rank. The typed ActorMesh<A> and the Python bindings both stand on this.
//
// Invariants:
//   ME-1 A cast's future resolves exactly once, with one entry per rank of the region.
//   ME-2 A rank whose proc has exited gets an error naming the proc and its exit status, at
//        once if the proc was already gone, else as soon as the exit is observed — a cast
//        never waits on a dead proc.
//   ME-9 The replies are runs in rank order (Replies): a run of ranks that gave byte-equal
//        replies is held once, so a tree cast whose actors all answer alike costs its caller
//        O(runs) to gather and hand over, not O(ranks) (docs/cast.md, "The root").
//   CS-1 A port cast (cast() with `reply_to`) takes the path of a one-way cast of the same
//        region: past the fan-out it goes through the relay tree, so its sender sends at most
//        fan-out messages (CT-1). Every actor answers `reply_to` itself, with its rank, as soon
//        as it has answered: nothing is gathered, nothing waits for the replies.
//   CS-2 A ReplyStream's k-th future resolves with the k-th reply to arrive, and rank(k)
//        then names the rank (of the called region) whose reply it is.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "podium/actor/future.h"
#include "podium/base/buffer.h"
#include "podium/channel/address.h"
#include "podium/mesh/cast_plan.h"
#include "podium/ndslice/region.h"
#include "podium/wire/envelope.h"

namespace podium::mesh {

// The value parts of one rank's reply, or why there is none.
using Reply = Result<std::vector<Buffer>>;

// Whether two replies are byte-equal (same parts, or the same error).
bool same_reply(const Reply& a, const Reply& b);

// The replies of a cast in rank order, as runs (ME-9): run i holds the one reply of ranks
// [run_begin(i), run_end(i)). A star cast of distinct replies has one run per rank.
class Replies {
 public:
  Replies() = default;
  explicit Replies(Reply one) { append(1, std::move(one)); }

  // The next `count` ranks (count > 0) all replied `reply`; an equal last run grows instead.
  void append(size_t count, Reply reply);

  size_t size() const { return size_; }  // ranks
  bool empty() const { return size_ == 0; }
  size_t runs() const { return values_.size(); }
  size_t run_begin(size_t i) const { return i == 0 ? 0 : ends_[i - 1]; }
  size_t run_end(size_t i) const { return ends_[i]; }
  const Reply& run_value(size_t i) const { return values_[i]; }
  // The reply of rank `rank` (< size()); O(log runs).
  const Reply& operator[](size_t rank) const;
  // The first failed rank and its error, if any; O(runs).
  std::optional<std::pair<size_t, const Error*>> first_error() const;

 private:
  std::vector<Reply> values_;
  std::vector<size_t> ends_;  // exclusive end rank of each run
  size_t size_ = 0;
};

// Answered ranks: disjoint [lo, hi) ranges, each with the one reply all its ranks gave,
// keyed by lo. O(ranges), not O(ranks): a relay's reduced answer of one run is one range.
struct Piece {
  size_t hi = 0;
  Reply value;
};
using Pieces = std::map<size_t, Piece>;
struct Chunk {
  size_t lo = 0;
  size_t hi = 0;
};
// The parts of [lo, hi) that `pieces` does not cover yet, in order.
std::vector<Chunk> gaps_in(const Pieces& pieces, size_t lo, size_t hi);

// Where one actor of a mesh is reached.
struct ActorTarget {
  channel::Address addr;       // its proc
  std::string dest;            // its mailbox PortId, text form
  std::string actor;           // its ActorId, text form (for error messages)
  std::string proc_key;        // addr.to_string(), for proc-exit matching
  std::string host;            // its host's name; empty: this host
};

// Gathers one reply per rank, as ranges (ME-9); thread-safe. Filling a range costs
// O(log ranges + gaps), completing O(ranges): never O(ranks) unless the replies differ.
class Collector {
 public:
  explicit Collector(std::vector<std::string> proc_key_per_rank);
  explicit Collector(std::shared_ptr<const std::vector<std::string>> proc_key_per_rank);
  actor::Future<Replies> future() const { return promise_.future(); }
  void fill(size_t rank, Reply reply) { fill_range(rank, rank + 1, reply); }
  // Ranks of [lo, hi) that are not filled yet get `reply` (a late duplicate changes nothing).
  void fill_range(size_t lo, size_t hi, const Reply& reply);
  // Fails every unanswered rank hosted by the proc `proc_key` (ME-2); O(ranks), on failure.
  void proc_failed(std::string_view proc_key, const Error& why);
  // Whether rank `rank` has its reply (or error) already.
  bool filled(size_t rank);
  uint64_t port = 0;  // the reply port, set once before the first send

 private:
  std::mutex mu_;  // guards pieces_, remaining_
  Pieces pieces_;
  size_t size_;
  size_t remaining_;
  std::shared_ptr<const std::vector<std::string>> proc_keys_;  // immutable
  actor::Promise<Replies> promise_;
};

// Per-actor load, for choose(): calls sent and not yet answered.
struct LoadCounters {
  explicit LoadCounters(size_t n) : outstanding(n) {}
  std::vector<std::atomic<int64_t>> outstanding;
};

// What casts to one region derive from its actors, built once per region (ActorMeshBase
// keeps it) and shared by its calls, so that a call's own work at the sender is O(runs) plus
// one integer per rank (its AC-11 number; docs/cast.md, "The root").
struct CastTargets {
  std::vector<const ActorTarget*> targets;  // by rank of the region
  std::vector<size_t> base_ranks;           // each rank's base rank (the load counters)
  std::shared_ptr<const std::vector<std::string>> proc_keys;  // each rank's proc (ME-2)
  bool remote = false;  // some rank lives in another proc
  // Every actor of its mesh: such a cast loads every rank alike, which cannot change which
  // rank choose() picks, so it is not counted per rank.
  bool whole = false;
  // Runtime::track(): none of these procs was dead as of this generation (0: not checked).
  mutable std::atomic<uint64_t> clean_generation{0};

  static std::shared_ptr<CastTargets> build(std::vector<const ActorTarget*> targets,
                                            std::vector<size_t> base_ranks, bool whole);
  // The AC-11 counters of every rank for the sender stream `stream` (Proc::seq_slots), found
  // once per stream.
  std::shared_ptr<const std::vector<uint64_t*>> seq_slots(uint64_t stream) const;
  // Each rank's mailbox PortId, as runs (tree casts), built on first use.
  std::shared_ptr<const PortRuns> ports() const;

 private:
  mutable std::mutex mu_;  // guards slots_, ports_
  mutable std::shared_ptr<const PortRuns> ports_;
  mutable std::vector<std::pair<uint64_t, std::shared_ptr<const std::vector<uint64_t*>>>> slots_;
};

// Sends `endpoint(args)` to every rank of `to` (the ranks of `extent`). With `want_reply`
// false the messages are one-way and the returned future is invalid; then `reply_to`, when
// not empty, is the port (a PortId text) every actor answers instead, with its rank (CS-1).
// More ranks than the cast fan-out go through the relay tree (relay.h) when `tree` is set;
// the caller clears it while the actors' spawn messages may still be on their way (a call
// through a relay could overtake the spawn, which the controller sends directly).
[[nodiscard]] actor::Future<Replies> cast(std::shared_ptr<const CastTargets> to,
                                          const ndslice::Extent& extent,
                                          std::string_view endpoint, std::vector<Buffer> args,
                                          bool want_reply,
                                          std::shared_ptr<LoadCounters> load = nullptr,
                                          bool tree = true, std::string_view reply_to = {});

// The replies of calls to every rank of a region in arrival order (CS-2): futures()[k] is
// the k-th reply to arrive, rank(k) whose it is. Thread-safe; made by
// ActorMeshBase::stream_raw().
class ReplyStream {
 public:
  // `calls[r]`: the call of rank r (one reply each). Futures are set on the threads that
  // complete the calls; each call holds the stream until it completes.
  static std::shared_ptr<ReplyStream> make(const std::vector<actor::Future<Replies>>& calls);
  ReplyStream(const ReplyStream&) = delete;
  ReplyStream& operator=(const ReplyStream&) = delete;

  size_t size() const { return slots_.size(); }
  // One future per rank, in arrival order.
  std::vector<actor::Future<Replies>> futures() const;
  // The rank whose reply is future k, once that future is ready; nullopt before.
  std::optional<size_t> rank(size_t k) const;

 private:
  explicit ReplyStream(size_t n) : ranks_(n), slots_(n) {}
  void arrived(size_t rank, const Result<Replies>& reply);

  mutable std::mutex mu_;      // guards next_, ranks_
  size_t next_ = 0;            // the slot the next reply fills
  std::vector<size_t> ranks_;  // ranks_[k]: the rank whose reply filled slot k (k < next_)
  std::vector<actor::Promise<Replies>> slots_;  // immutable size
};

// The plan of a tree cast to `to` (relay.h), as the sender makes it: every rank's AC-11
// number is taken now, so the calls keep their order against direct sends whichever path
// they take. O(runs) plus one counter per rank.
struct CastPlan;
std::shared_ptr<CastPlan> make_tree_plan(const CastTargets& to, const ndslice::Extent& extent,
                                         std::string_view endpoint, std::vector<Buffer> args,
                                         bool want_reply, std::string_view reply_to = {});

// Splits a kReply envelope into the replying rank and its value (or error).
std::pair<uint64_t, Reply> decode_reply(wire::Envelope&& env);

// "actor counter[3] of mesh 'counter' (rank 3 {'procs': 3/4}, host h, pid 42): <cause>"
// (host and pid when `pid` is known).
Error rank_error(const ndslice::Extent& extent, size_t rank, const ActorTarget& t,
                 const Error& cause, int64_t pid = -1);

}  // namespace podium::mesh
