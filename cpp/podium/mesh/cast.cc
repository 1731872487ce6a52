#include "podium/mesh/cast.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "podium/actor/mesh_failure.h"
#include "podium/actor/message.h"
#include "podium/mesh/relay.h"
#include "podium/mesh/runtime.h"

namespace podium::mesh {

bool same_reply(const Reply& a, const Reply& b) {
  if (a.has_value() != b.has_value()) return false;
  if (!a) {
    return a.error().subsystem == b.error().subsystem && a.error().code == b.error().code &&
           a.error().message == b.error().message;
  }
  if (a->size() != b->size()) return false;
  for (size_t i = 0; i < a->size(); ++i) {
    const Buffer& x = (*a)[i];
    const Buffer& y = (*b)[i];
    if (x.size() != y.size()) return false;
    if (x.data() != y.data() && std::memcmp(x.data(), y.data(), x.size()) != 0) return false;
  }
  return true;
}

// --- Replies -------------------------------------------------------------------------------

void Replies::append(size_t count, Reply reply) {
  if (count == 0) return;
  size_ += count;
  if (!values_.empty() && same_reply(values_.back(), reply)) {
    ends_.back() = size_;
    return;
  }
  values_.push_back(std::move(reply));
  ends_.push_back(size_);
}

const Reply& Replies::operator[](size_t rank) const {
  auto it = std::upper_bound(ends_.begin(), ends_.end(), rank);
  return values_[static_cast<size_t>(it - ends_.begin())];
}

std::optional<std::pair<size_t, const Error*>> Replies::first_error() const {
  for (size_t i = 0; i < values_.size(); ++i) {
    if (!values_[i]) return std::make_pair(run_begin(i), &values_[i].error());
  }
  return std::nullopt;
}

std::vector<Chunk> gaps_in(const Pieces& pieces, size_t lo, size_t hi) {
  std::vector<Chunk> out;
  size_t cur = lo;
  auto it = pieces.upper_bound(lo);
  if (it != pieces.begin()) cur = std::max(cur, std::prev(it)->second.hi);
  while (cur < hi) {
    if (it == pieces.end() || it->first >= hi) {
      out.push_back(Chunk{cur, hi});
      break;
    }
    if (it->first > cur) out.push_back(Chunk{cur, it->first});
    cur = std::max(cur, it->second.hi);
    ++it;
  }
  return out;
}

// --- Collector -----------------------------------------------------------------------------

Collector::Collector(std::vector<std::string> proc_key_per_rank)
    : Collector(std::make_shared<const std::vector<std::string>>(std::move(proc_key_per_rank))) {}

Collector::Collector(std::shared_ptr<const std::vector<std::string>> proc_key_per_rank)
    : size_(proc_key_per_rank->size()),
      remaining_(proc_key_per_rank->size()),
      proc_keys_(std::move(proc_key_per_rank)) {}

void Collector::fill_range(size_t lo, size_t hi, const Reply& reply) {
  Replies done;
  {
    std::lock_guard lock(mu_);
    hi = std::min(hi, size_);
    if (remaining_ == 0 || lo >= hi) return;
    for (Chunk g : gaps_in(pieces_, lo, hi)) {  // a late duplicate finds no gap
      pieces_.emplace(g.lo, Piece{g.hi, reply});
      remaining_ -= g.hi - g.lo;
    }
    if (remaining_ != 0) return;
    for (auto& [first, piece] : pieces_) done.append(piece.hi - first, std::move(piece.value));
    pieces_.clear();
  }
  promise_.set(std::move(done));
}

bool Collector::filled(size_t rank) {
  std::lock_guard lock(mu_);
  if (rank >= size_) return false;
  if (remaining_ == 0) return true;
  return gaps_in(pieces_, rank, rank + 1).empty();
}

void Collector::proc_failed(std::string_view proc_key, const Error& why) {
  const auto& keys = *proc_keys_;
  Reply failed{std::unexpected(why)};
  for (size_t r = 0; r < keys.size(); ++r) {
    if (keys[r] == proc_key) fill_range(r, r + 1, failed);
  }
}

std::pair<uint64_t, Reply> decode_reply(wire::Envelope&& env) {
  if (env.parts.empty()) {
    return {0, std::unexpected(make_error(actor::ActorErrc::kBadArguments,
                                          "reply from " + env.sender + " has no header"))};
  }
  auto h = actor::decode_reply_header(env.parts[0]);
  if (!h) return {0, std::unexpected(std::move(h.error()))};
  if (!h->ok) return {h->rank, std::unexpected(std::move(h->error))};
  env.parts.erase(env.parts.begin());
  return {h->rank, std::move(env.parts)};
}

Error rank_error(const ndslice::Extent& extent, size_t rank, const ActorTarget& t,
                 const Error& cause, int64_t pid) {
  size_t hash = t.actor.rfind('#');
  std::string key = hash == std::string::npos ? t.actor : t.actor.substr(hash + 1);
  std::string mesh = key.substr(0, key.find('['));
  std::string msg = "actor " + key + " of mesh '" + mesh + "' (rank " + std::to_string(rank);
  if (auto p = extent.point_of_rank(rank)) msg += " " + p->to_string();
  if (pid > 0) {
    msg += ", host " + (t.host.empty() ? actor::host_name() : t.host) + ", pid " +
           std::to_string(pid);
  }
  msg += "): ";
  // The cause often names the actor already ("<actor id>: ..."): say it once.
  std::string_view why = cause.message;
  if (why.starts_with(t.actor + ": ")) why.remove_prefix(t.actor.size() + 2);
  msg += why;
  return Error{cause.subsystem, cause.code, std::move(msg)};
}

// --- CastTargets ---------------------------------------------------------------------------

std::shared_ptr<CastTargets> CastTargets::build(std::vector<const ActorTarget*> targets,
                                                std::vector<size_t> base_ranks, bool whole) {
  auto out = std::make_shared<CastTargets>();
  auto keys = std::make_shared<std::vector<std::string>>();
  keys->reserve(targets.size());
  const std::string& self = Runtime::get().proc_key();
  for (const auto* t : targets) {
    keys->push_back(t->proc_key);
    out->remote |= t->proc_key != self;
  }
  out->proc_keys = std::move(keys);
  out->targets = std::move(targets);
  out->base_ranks = std::move(base_ranks);
  out->whole = whole;
  return out;
}

std::shared_ptr<const std::vector<uint64_t*>> CastTargets::seq_slots(uint64_t stream) const {
  std::lock_guard lock(mu_);
  for (const auto& [s, slots] : slots_) {
    if (s == stream) return slots;
  }
  std::vector<const std::string*> dests;
  dests.reserve(targets.size());
  for (const auto* t : targets) dests.push_back(&t->dest);
  // The counters' blocks live as long as these pointers to them (Proc::SeqSlots).
  auto held = std::make_shared<const actor::Proc::SeqSlots>(
      Runtime::get().proc().seq_slots(stream, dests));
  std::shared_ptr<const std::vector<uint64_t*>> slots(held, &held->slots);
  // A mesh is called from a few senders (the controller's thread, some actors); the last few
  // streams stay, the oldest goes.
  constexpr size_t kStreams = 8;
  if (slots_.size() == kStreams) slots_.erase(slots_.begin());
  slots_.emplace_back(stream, slots);
  return slots;
}

std::shared_ptr<const PortRuns> CastTargets::ports() const {
  std::lock_guard lock(mu_);
  if (!ports_) {
    std::vector<const std::string*> dests;
    dests.reserve(targets.size());
    for (const auto* t : targets) dests.push_back(&t->dest);
    ports_ = std::make_shared<const PortRuns>(PortRuns::build(dests));
  }
  return ports_;
}

std::shared_ptr<CastPlan> make_tree_plan(const CastTargets& to, const ndslice::Extent& extent,
                                         std::string_view endpoint, std::vector<Buffer> args,
                                         bool want_reply, std::string_view reply_to) {
  auto& proc = Runtime::get().proc();
  auto plan = std::make_shared<CastPlan>();
  plan->fanout = cast_fanout();
  plan->endpoint.assign(endpoint);
  if (const auto* me = actor::current_actor_text()) plan->sender = *me;
  plan->stream = proc.sender_stream();
  plan->labels = extent.labels();
  plan->sizes.assign(extent.sizes().begin(), extent.sizes().end());
  auto slots = to.seq_slots(plan->stream);
  // Reused: a fresh vector of a large mesh's numbers would cost its page faults every call.
  thread_local std::vector<uint64_t> seqs;
  seqs.resize(slots->size());
  proc.next_seqs(*slots, seqs.data());
  plan->ports = *to.ports();
  plan->seqs = SeqRuns::build(seqs);
  plan->args = std::move(args);
  plan->want_reply = want_reply;
  if (!want_reply) plan->reply_to.assign(reply_to);
  return plan;
}

actor::Future<Replies> cast(std::shared_ptr<const CastTargets> to_ptr,
                            const ndslice::Extent& extent, std::string_view endpoint,
                            std::vector<Buffer> args, bool want_reply,
                            std::shared_ptr<LoadCounters> load, bool allow_tree,
                            std::string_view reply_to) {
  auto& rt = Runtime::get();
  auto& proc = rt.proc();
  const CastTargets& to = *to_ptr;
  const auto& targets = to.targets;
  size_t fanout = cast_fanout();
  // CT-1; a star costs no more at or below the fan-out.
  bool tree = allow_tree && fanout != 0 && targets.size() > fanout;
  if (to.whole && tree) load = nullptr;  // it would not change choose()'s pick (CastTargets)
  if (!want_reply && tree) {
    start_tree_cast(rt.relay(),
                    make_tree_plan(to, extent, endpoint, std::move(args), false, reply_to),
                    nullptr, {});
    return {};
  }
  std::shared_ptr<Collector> collector;
  std::string reply_port(want_reply ? std::string_view() : reply_to);  // CS-1
  if (want_reply) {
    collector = std::make_shared<Collector>(to.proc_keys);
    // This process cannot outlive its own proc: only remote procs can fail a call (ME-2).
    if (to.remote) rt.track(collector, *to.proc_keys, &to.clean_generation);
    if (load) {
      for (size_t b : to.base_ranks) {
        load->outstanding[b].fetch_add(1, std::memory_order_relaxed);
      }
    }
    if (tree) {  // the root of the tree hands the replies to the collector by range (CT-3)
      auto fill_range = [collector, load, to_ptr](size_t lo, size_t hi, const Reply& reply) {
        if (load) {
          const auto& base = to_ptr->base_ranks;
          for (size_t r = lo; r < hi && r < base.size(); ++r) {
            load->outstanding[base[r]].fetch_sub(1, std::memory_order_relaxed);
          }
        }
        collector->fill_range(lo, hi, reply);
      };
      auto done = collector->future();
      start_tree_cast(rt.relay(), make_tree_plan(to, extent, endpoint, std::move(args), true),
                      std::move(fill_range), done);
      return done;
    }
    // The port holds the collector until it completes; completion closes the port, whether
    // the last reply or a proc's exit (ME-2) completed it.
    auto handler = [collector, load, to_ptr](wire::Envelope&& env) {
      auto [rank, reply] = decode_reply(std::move(env));
      if (load && rank < to_ptr->base_ranks.size()) {
        load->outstanding[to_ptr->base_ranks[rank]].fetch_sub(1, std::memory_order_relaxed);
      }
      collector->fill(rank, std::move(reply));
    };
    auto port = proc.open_port(std::move(handler), targets.size() == 1);
    collector->port = port.port;
    reply_port = proc.port_text(port.port);
    collector->future().on_ready(
        [&proc, p = port.port](const Result<Replies>&) { proc.close_port(p); });
  }

  std::string sender;
  if (const auto* me = actor::current_actor_text()) sender = *me;
  for (size_t r = 0; r < targets.size(); ++r) {
    const ActorTarget& t = *targets[r];
    wire::Envelope env;
    env.kind = static_cast<uint8_t>(actor::MessageKind::kCall);
    env.dest = t.dest;
    env.sender = sender;
    env.fan_out = targets.size() > 1;  // the same arguments to each: lent, not copied (CH-29)
    if (!reply_port.empty()) env.headers.emplace_back(actor::kReplyHeader, reply_port);
    env.parts.reserve(1 + args.size());
    env.parts.push_back(actor::encode_call_header(endpoint, r, extent.labels(), extent.sizes()));
    for (const auto& a : args) env.parts.push_back(a);
    proc.send(t.addr, std::move(env));
  }
  if (!want_reply) return {};
  return collector->future();
}

}  // namespace podium::mesh

namespace podium::mesh {

// --- ReplyStream ---------------------------------------------------------------------------

std::shared_ptr<ReplyStream> ReplyStream::make(const std::vector<actor::Future<Replies>>& calls) {
  std::shared_ptr<ReplyStream> st(new ReplyStream(calls.size()));
  // Each call holds the stream until it completes.
  for (size_t r = 0; r < calls.size(); ++r) {
    calls[r].on_ready([st, r](const Result<Replies>& reply) { st->arrived(r, reply); });
  }
  return st;
}

std::vector<actor::Future<Replies>> ReplyStream::futures() const {
  std::vector<actor::Future<Replies>> out;
  out.reserve(slots_.size());
  for (const auto& s : slots_) out.push_back(s.future());
  return out;
}

std::optional<size_t> ReplyStream::rank(size_t k) const {
  std::lock_guard lock(mu_);
  if (k >= next_) return std::nullopt;
  return ranks_[k];
}

void ReplyStream::arrived(size_t rank, const Result<Replies>& reply) {
  size_t k;
  {
    std::lock_guard lock(mu_);
    k = next_++;
    ranks_[k] = rank;
  }
  slots_[k].set(reply);
}

}  // namespace podium::mesh
