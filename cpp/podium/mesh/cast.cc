#include "podium/mesh/cast.h"

#include <algorithm>
#include <list>
#include <mutex>

#include "podium/actor/mesh_failure.h"
#include "podium/actor/message.h"
#include "podium/mesh/relay.h"
#include "podium/mesh/runtime.h"

namespace podium::mesh {

Collector::Collector(std::vector<std::string> proc_key_per_rank)
    : Collector(std::make_shared<const std::vector<std::string>>(std::move(proc_key_per_rank))) {}

Collector::Collector(std::shared_ptr<const std::vector<std::string>> proc_key_per_rank)
    : slots_(proc_key_per_rank->size()),
      remaining_(proc_key_per_rank->size()),
      proc_keys_(std::move(proc_key_per_rank)) {}

void Collector::fill(size_t rank, Reply reply) {
  Replies done;
  {
    std::lock_guard lock(mu_);
    if (rank >= slots_.size() || slots_[rank]) return;  // late duplicate: the slot is final
    slots_[rank] = std::move(reply);
    if (--remaining_ != 0) return;
    done.reserve(slots_.size());
    for (auto& s : slots_) done.push_back(std::move(*s));
  }
  promise_.set(std::move(done));
}

void Collector::fill_range(size_t lo, size_t hi, const Reply& reply) {
  Replies done;
  {
    std::lock_guard lock(mu_);
    hi = std::min(hi, slots_.size());
    size_t before = remaining_;
    for (size_t r = lo; r < hi; ++r) {
      if (slots_[r]) continue;  // late duplicate: the slot is final
      slots_[r] = reply;
      --remaining_;
    }
    if (remaining_ != 0 || before == 0) return;
    done.reserve(slots_.size());
    for (auto& s : slots_) done.push_back(std::move(*s));
  }
  promise_.set(std::move(done));
}

bool Collector::filled(size_t rank) {
  std::lock_guard lock(mu_);
  return rank < slots_.size() && slots_[rank].has_value();
}

void Collector::proc_failed(std::string_view proc_key, const Error& why) {
  const auto& keys = *proc_keys_;
  for (size_t r = 0; r < keys.size(); ++r) {
    if (keys[r] == proc_key) fill(r, std::unexpected(why));
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

namespace {

// What a cast to n actors derives from their PortIds (the proc key of each rank, for ME-2; the
// rank tables of a tree cast), kept for the last few sets of targets. A call is usually one of
// many to the same actors, and rebuilding these costs the sender ~200 ns a rank (the keys'
// copies) and ~300 more (tokenising the PortIds, CP-1), where checking that the PortIds are
// the same costs ~10. Found by content, never by address: a mesh that went away and one that
// took its memory cannot share an entry. A PortId determines its proc key (the address
// before '#'), so the PortIds alone are compared.
class TargetTables {
 public:
  struct Tables {
    std::shared_ptr<const std::vector<std::string>> proc_keys;
    std::shared_ptr<const PortRuns> ports;  // tree casts only
  };

  Tables get(const std::vector<const ActorTarget*>& targets, bool want_ports) {
    if (targets.size() < kMinRanks) return build(targets, want_ports, nullptr);
    std::lock_guard lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (!same(*it, targets)) continue;
      if (want_ports && !it->tables.ports) it->tables.ports = build_ports(targets);
      Tables t = it->tables;
      if (it != entries_.begin()) entries_.splice(entries_.begin(), entries_, it);
      return t;
    }
    Entry e;
    e.tables = build(targets, want_ports, &e.dests);
    Tables t = e.tables;
    entries_.push_front(std::move(e));
    if (entries_.size() > kEntries) entries_.pop_back();
    return t;
  }

 private:
  // Smaller casts (call_one, a few ranks) cost little to rebuild and would push the large ones
  // out of the cache.
  static constexpr size_t kMinRanks = 32;
  static constexpr size_t kEntries = 4;
  struct Entry {
    std::vector<std::string> dests;
    Tables tables;
  };

  static Tables build(const std::vector<const ActorTarget*>& targets, bool want_ports,
                      std::vector<std::string>* dests) {
    auto keys = std::make_shared<std::vector<std::string>>();
    keys->reserve(targets.size());
    if (dests) dests->reserve(targets.size());
    for (const auto* t : targets) {
      keys->push_back(t->proc_key);
      if (dests) dests->push_back(t->dest);
    }
    Tables out;
    out.proc_keys = std::move(keys);
    if (want_ports) out.ports = build_ports(targets);
    return out;
  }

  static bool same(const Entry& e, const std::vector<const ActorTarget*>& targets) {
    if (e.dests.size() != targets.size()) return false;
    for (size_t r = 0; r < targets.size(); ++r) {
      if (e.dests[r] != targets[r]->dest) return false;
    }
    return true;
  }

  static std::shared_ptr<const PortRuns> build_ports(
      const std::vector<const ActorTarget*>& targets) {
    std::vector<const std::string*> dests;
    dests.reserve(targets.size());
    for (const auto* t : targets) dests.push_back(&t->dest);
    return std::make_shared<const PortRuns>(PortRuns::build(dests));
  }

  std::mutex mu_;              // guards entries_
  std::list<Entry> entries_;   // most recently used first, at most kEntries
};

TargetTables& target_tables() {
  static TargetTables* tables = new TargetTables;  // never destroyed: used until exit
  return *tables;
}

// The cast through the relay tree (relay.h): the sender stamps every rank's AC-11 number now,
// so the calls keep their order against direct sends whichever path they take.
actor::Future<Replies> tree_cast(const std::vector<const ActorTarget*>& targets,
                                 const std::vector<size_t>& base_ranks,
                                 const ndslice::Extent& extent, std::string_view endpoint,
                                 std::vector<Buffer> args, bool want_reply,
                                 const std::shared_ptr<LoadCounters>& load,
                                 RangeSink sink, actor::Future<Replies> done,
                                 std::shared_ptr<const PortRuns> ports) {
  auto& rt = Runtime::get();
  auto& proc = rt.proc();
  auto plan = std::make_shared<CastPlan>();
  plan->fanout = cast_fanout();
  plan->endpoint.assign(endpoint);
  if (const auto* me = actor::current_actor_text()) plan->sender = *me;
  plan->stream = proc.sender_stream();
  plan->labels = extent.labels();
  plan->sizes.assign(extent.sizes().begin(), extent.sizes().end());
  std::vector<const std::string*> dests;
  dests.reserve(targets.size());
  for (size_t r = 0; r < targets.size(); ++r) {
    dests.push_back(&targets[r]->dest);
    if (load && want_reply) {
      load->outstanding[base_ranks[r]].fetch_add(1, std::memory_order_relaxed);
    }
  }
  std::vector<uint64_t> seqs(targets.size());
  proc.next_seqs(plan->stream, dests, {}, seqs.data());
  plan->ports = *ports;
  plan->seqs = SeqRuns::build(seqs);
  plan->args = std::move(args);
  plan->want_reply = want_reply;
  start_tree_cast(rt.relay(), std::move(plan), std::move(sink), done);
  return done;
}

}  // namespace

actor::Future<Replies> cast(const std::vector<const ActorTarget*>& targets,
                            const std::vector<size_t>& base_ranks, const ndslice::Extent& extent,
                            std::string_view endpoint, std::vector<Buffer> args, bool want_reply,
                            std::shared_ptr<LoadCounters> load, bool allow_tree) {
  auto& rt = Runtime::get();
  auto& proc = rt.proc();
  size_t fanout = cast_fanout();
  // CT-1; a star costs no more at or below the fan-out.
  bool tree = allow_tree && fanout != 0 && targets.size() > fanout;
  std::shared_ptr<Collector> collector;
  std::string reply_port;
  if (!want_reply && tree) {
    (void)tree_cast(targets, base_ranks, extent, endpoint, std::move(args), false, nullptr,
                    nullptr, {}, target_tables().get(targets, true).ports);
    return {};
  }
  if (want_reply) {
    auto tables = target_tables().get(targets, tree);
    const auto& keys = tables.proc_keys;
    bool remote = false;
    const std::string& self = rt.proc_key();
    for (const auto* t : targets) remote |= t->proc_key != self;
    collector = std::make_shared<Collector>(keys);
    // This process cannot outlive its own proc: only remote procs can fail a call (ME-2).
    if (remote) rt.track(collector, *keys);
    auto fill = [collector, load, base_ranks](size_t rank, Reply reply) {
      if (load && rank < base_ranks.size()) {
        load->outstanding[base_ranks[rank]].fetch_sub(1, std::memory_order_relaxed);
      }
      collector->fill(rank, std::move(reply));
    };
    if (tree) {  // the root of the tree hands the replies to the collector by range (CT-3)
      auto fill_range = [collector, load, base_ranks](size_t lo, size_t hi, const Reply& reply) {
        if (load) {
          for (size_t r = lo; r < hi && r < base_ranks.size(); ++r) {
            load->outstanding[base_ranks[r]].fetch_sub(1, std::memory_order_relaxed);
          }
        }
        collector->fill_range(lo, hi, reply);
      };
      return tree_cast(targets, base_ranks, extent, endpoint, std::move(args), true, load,
                       std::move(fill_range), collector->future(), tables.ports);
    }
    // The port holds the collector until it completes; completion closes the port, whether
    // the last reply or a proc's exit (ME-2) completed it.
    auto handler = [fill = std::move(fill)](wire::Envelope&& env) {
      auto [rank, reply] = decode_reply(std::move(env));
      fill(rank, std::move(reply));
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
    if (want_reply) env.headers.emplace_back(actor::kReplyHeader, reply_port);
    env.parts.reserve(1 + args.size());
    env.parts.push_back(actor::encode_call_header(endpoint, r, extent.labels(), extent.sizes()));
    for (const auto& a : args) env.parts.push_back(a);
    if (load && want_reply) {
      load->outstanding[base_ranks[r]].fetch_add(1, std::memory_order_relaxed);
    }
    proc.send(t.addr, std::move(env));
  }
  if (!want_reply) return {};
  return collector->future();
}

}  // namespace podium::mesh
