// Untyped casts: one endpoint call sent to every actor of a mesh region, replies gathered by
// rank. The typed ActorMesh<A> and the Python bindings both stand on this.
//
// Invariants:
//   ME-1 A cast's future resolves exactly once, with one entry per rank of the region.
//   ME-2 A rank whose proc has exited gets an error naming the proc and its exit status, at
//        once if the proc was already gone, else as soon as the exit is observed — a cast
//        never waits on a dead proc.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "podium/actor/future.h"
#include "podium/base/buffer.h"
#include "podium/channel/address.h"
#include "podium/ndslice/region.h"
#include "podium/wire/envelope.h"

namespace podium::mesh {

// The value parts of one rank's reply, or why there is none.
using Reply = Result<std::vector<Buffer>>;
using Replies = std::vector<Reply>;

// Where one actor of a mesh is reached.
struct ActorTarget {
  channel::Address addr;       // its proc
  std::string dest;            // its mailbox PortId, text form
  std::string actor;           // its ActorId, text form (for error messages)
  std::string proc_key;        // addr.to_string(), for proc-exit matching
  std::string host;            // its host's name; empty: this host
};

// Gathers one reply per rank; thread-safe.
class Collector {
 public:
  explicit Collector(std::vector<std::string> proc_key_per_rank);
  explicit Collector(std::shared_ptr<const std::vector<std::string>> proc_key_per_rank);
  actor::Future<Replies> future() const { return promise_.future(); }
  void fill(size_t rank, Reply reply);
  // Ranks [lo, hi) that are not filled yet get `reply` (one lock for the range).
  void fill_range(size_t lo, size_t hi, const Reply& reply);
  // Fails every unanswered rank hosted by the proc `proc_key` (ME-2).
  void proc_failed(std::string_view proc_key, const Error& why);
  // Whether rank `rank` has its reply (or error) already.
  bool filled(size_t rank);
  uint64_t port = 0;  // the reply port, set once before the first send

 private:
  std::mutex mu_;                             // guards slots_, remaining_
  std::vector<std::optional<Reply>> slots_;
  size_t remaining_;
  std::shared_ptr<const std::vector<std::string>> proc_keys_;  // immutable
  actor::Promise<Replies> promise_;
};

// Per-actor load, for choose(): calls sent and not yet answered.
struct LoadCounters {
  explicit LoadCounters(size_t n) : outstanding(n) {}
  std::vector<std::atomic<int64_t>> outstanding;
};

// Sends `endpoint(args)` to targets[r] for every rank r (the ranks of `extent`). With
// `want_reply` false the messages are one-way and the returned future is invalid. More
// targets than the cast fan-out go through the relay tree (relay.h) when `tree` is set; the
// caller clears it while the actors' spawn messages may still be on their way (a call through
// a relay could overtake the spawn, which the controller sends directly).
[[nodiscard]] actor::Future<Replies> cast(const std::vector<const ActorTarget*>& targets,
                                          const std::vector<size_t>& base_ranks,
                                          const ndslice::Extent& extent,
                                          std::string_view endpoint, std::vector<Buffer> args,
                                          bool want_reply,
                                          std::shared_ptr<LoadCounters> load = nullptr,
                                          bool tree = true);

// Splits a kReply envelope into the replying rank and its value (or error).
std::pair<uint64_t, Reply> decode_reply(wire::Envelope&& env);

// "actor counter[3] of mesh 'counter' (rank 3 {'procs': 3/4}, host h, pid 42): <cause>"
// (host and pid when `pid` is known).
Error rank_error(const ndslice::Extent& extent, size_t rank, const ActorTarget& t,
                 const Error& cause, int64_t pid = -1);

}  // namespace podium::mesh
