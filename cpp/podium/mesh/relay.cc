#include "podium/mesh/relay.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>
#include <deque>
#include <map>
#include <msgpack.hpp>
#include <mutex>
#include <optional>
#include <random>

#include "podium/actor/ids.h"
#include "podium/actor/message.h"
#include "podium/actor/proc.h"
#include "podium/mesh/runtime.h"
#include "podium/wire/peer_msgpack.h"

namespace podium::mesh {
namespace {

constexpr size_t kUnset = SIZE_MAX;
std::atomic<size_t> g_fanout{kUnset};

// A reduced reply (CT-3) is a kReply with this header; part 0 is its run table.
constexpr std::string_view kRunsHeader = "runs";
// Finished nodes kept to answer a chunk sent again by a new parent (CT-4).
constexpr size_t kFinishedKept = 256;
// The key of a cast's root node in the registry (chunks never start there).
constexpr size_t kRootLo = SIZE_MAX;

Error relay_error(std::string msg) {
  return make_error(actor::ActorErrc::kBadArguments, std::move(msg));
}

std::string system_port_of(std::string_view addr) {
  std::string out(addr);
  out += '#';
  out += actor::kSystemActorName;
  out += "[0]:0";
  return out;
}

std::string_view addr_of(const std::string& dest) {
  auto v = actor::split_port_id(dest);
  return v ? v->addr : std::string_view();
}

Buffer to_buffer(const msgpack::sbuffer& sb) {
  return Buffer::copy_of(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(sb.data()), sb.size()));
}

// CT-3: part 0 = [lo, [[count, true, nparts] | [count, false, subsystem, code, message]...]],
// then the parts of each ok run, once per run. `pieces` must cover a range without gaps;
// neighbouring pieces with byte-equal replies become one run.
std::vector<Buffer> encode_runs(size_t lo, const Pieces& pieces) {
  struct Run {
    const Reply* value;
    size_t count;
  };
  std::vector<Run> runs;
  for (const auto& [first, piece] : pieces) {
    size_t count = piece.hi - first;
    if (!runs.empty() && same_reply(*runs.back().value, piece.value)) {
      runs.back().count += count;
    } else {
      runs.push_back(Run{&piece.value, count});
    }
  }
  msgpack::sbuffer sb;
  msgpack::packer<msgpack::sbuffer> pk(sb);
  pk.pack_array(2);
  pk.pack(static_cast<uint64_t>(lo));
  pk.pack_array(static_cast<uint32_t>(runs.size()));
  std::vector<Buffer> parts(1);
  for (const Run& r : runs) {
    const Reply& v = *r.value;
    if (v) {
      pk.pack_array(3);
      pk.pack(static_cast<uint64_t>(r.count));
      pk.pack(true);
      pk.pack(static_cast<uint64_t>(v->size()));
      for (const Buffer& b : *v) parts.push_back(b);
    } else {
      pk.pack_array(5);
      pk.pack(static_cast<uint64_t>(r.count));
      pk.pack(false);
      pk.pack(static_cast<uint64_t>(v.error().subsystem));
      pk.pack(static_cast<uint64_t>(v.error().code));
      pk.pack(v.error().message);
    }
  }
  parts[0] = to_buffer(sb);
  return parts;
}

// Calls fill(lo, hi, reply) for every run of a reduced reply, in rank order.
template <class Fill>
Status decode_runs(const std::vector<Buffer>& parts, Fill&& fill) {
  try {
    if (parts.empty()) return std::unexpected(relay_error("reduced reply without a run table"));
    msgpack::object_handle oh =
        msgpack::unpack(reinterpret_cast<const char*>(parts[0].data()), parts[0].size(), nullptr,
                        nullptr, wire::peer_unpack_limit(parts[0].size()));  // WI-7
    const auto& o = oh.get();
    if (o.type != msgpack::type::ARRAY || o.via.array.size != 2) {
      return std::unexpected(relay_error("reduced reply: run table is not a 2-array"));
    }
    size_t rank = o.via.array.ptr[0].as<uint64_t>();
    const auto& runs = o.via.array.ptr[1];
    if (runs.type != msgpack::type::ARRAY) return std::unexpected(relay_error("bad runs"));
    size_t next_part = 1;
    for (uint32_t i = 0; i < runs.via.array.size; ++i) {
      const auto& r = runs.via.array.ptr[i];
      if (r.type != msgpack::type::ARRAY || r.via.array.size < 3) {
        return std::unexpected(relay_error("bad run"));
      }
      size_t count = r.via.array.ptr[0].as<uint64_t>();
      bool ok = r.via.array.ptr[1].as<bool>();
      if (ok) {
        size_t n = r.via.array.ptr[2].as<uint64_t>();
        if (next_part + n > parts.size()) return std::unexpected(relay_error("run past parts"));
        std::vector<Buffer> value(parts.begin() + next_part, parts.begin() + next_part + n);
        next_part += n;
        fill(rank, rank + count, Reply(std::move(value)));
        rank += count;
      } else {
        if (r.via.array.size != 5) return std::unexpected(relay_error("bad error run"));
        Error e{static_cast<Subsystem>(r.via.array.ptr[2].as<uint64_t>()),
                static_cast<uint16_t>(r.via.array.ptr[3].as<uint64_t>()),
                r.via.array.ptr[4].as<std::string>()};
        fill(rank, rank + count, Reply(std::unexpected(std::move(e))));
        rank += count;
      }
    }
    return ok();
  } catch (const std::exception& e) {
    return std::unexpected(relay_error(std::string("malformed reduced reply: ") + e.what()));
  }
}

// Part 1 of a "cast" message: three msgpack values back to back, [labels, sizes], then the
// PortRuns and the SeqRuns of ranks c.lo..c.hi-1 (docs/cast.md). O(runs), not O(ranks).
Buffer encode_plan_part(const CastPlan& p, size_t plan_lo, Chunk c) {
  msgpack::sbuffer sb;
  msgpack::packer<msgpack::sbuffer> pk(sb);
  pk.pack_array(2);
  pk.pack(p.labels);
  pk.pack_array(static_cast<uint32_t>(p.sizes.size()));
  for (size_t s : p.sizes) pk.pack(static_cast<uint64_t>(s));
  std::string tables;
  p.ports.slice(c.lo - plan_lo, c.hi - plan_lo).encode(tables);
  p.seqs.slice(c.lo - plan_lo, c.hi - plan_lo).encode(tables);
  sb.write(tables.data(), tables.size());
  return to_buffer(sb);
}

Status decode_plan_part(const Buffer& b, size_t ranks, CastPlan& p) {
  std::string_view data(reinterpret_cast<const char*>(b.data()), b.size());
  size_t off = 0;
  try {
    msgpack::object_handle oh = msgpack::unpack(data.data(), data.size(), off, nullptr, nullptr,
                                                wire::peer_unpack_limit(data.size()));
    const auto& o = oh.get();
    if (o.type != msgpack::type::ARRAY || o.via.array.size != 2) {
      return std::unexpected(relay_error("cast plan: region is not a 2-array"));
    }
    o.via.array.ptr[0].convert(p.labels);
    std::vector<uint64_t> sizes;
    o.via.array.ptr[1].convert(sizes);
    p.sizes.assign(sizes.begin(), sizes.end());
  } catch (const std::exception& e) {
    return std::unexpected(relay_error(std::string("malformed cast plan: ") + e.what()));
  }
  auto ports = PortRuns::decode(data, &off, ranks);
  if (!ports) return std::unexpected(ports.error());
  auto seqs = SeqRuns::decode(data, &off, ranks);
  if (!seqs) return std::unexpected(seqs.error());
  p.ports = std::move(*ports);
  p.seqs = std::move(*seqs);
  return ok();
}

}  // namespace

size_t cast_fanout() {
  size_t k = g_fanout.load(std::memory_order_relaxed);
  if (k != kUnset) return k;
  k = kDefaultCastFanout;
  if (const char* v = std::getenv("PODIUM_CAST_FANOUT"); v && *v) k = std::strtoull(v, nullptr, 10);
  g_fanout.store(k, std::memory_order_relaxed);
  return k;
}

void set_cast_fanout(size_t k) { g_fanout.store(k, std::memory_order_relaxed); }

std::vector<Chunk> split_chunks(size_t lo, size_t hi, size_t k) {
  std::vector<Chunk> out;
  if (hi <= lo || k == 0) return out;
  size_t n = hi - lo;
  size_t parts = std::min(k, n);
  size_t base = n / parts, extra = n % parts;
  out.reserve(parts);
  for (size_t i = 0; i < parts; ++i) {
    size_t len = base + (i < extra ? 1 : 0);
    out.push_back(Chunk{lo, lo + len});
    lo += len;
  }
  return out;
}

// --- nodes -------------------------------------------------------------------------------

namespace {

// One node of one cast in this process: the root (the sender) or a chunk's head.
struct Node {
  struct Child {
    Chunk chunk;
    std::string proc_key;  // the proc of chunk.lo
    bool adopted = false;  // its proc exited and this node took over its children (CT-4)
  };

  std::shared_ptr<const CastPlan> plan;  // ports/seqs of ranks plan_lo..
  size_t plan_lo = 0;
  Chunk chunk;  // the ranks this node answers for; the root: [0, n)
  bool root = false;
  uint64_t gather_port = 0;  // where the replies of this node's chunk arrive
  RangeSink sink;  // root: hands the replies to the caller

  std::mutex mu;  // guards everything below
  // The ranks answered so far (the root keeps no values: they went to the sink).
  Pieces pieces;
  size_t remaining = 0;
  std::vector<Child> children;
  // Non-root: where the answer goes. A chunk sent again by an adopting node adds its port; the
  // first copy can arrive after the second (both were in flight), so every parent whose proc
  // is not known to be dead gets the answer, and duplicates are ignored there (CT-4).
  std::vector<std::string> parent_ports;
  bool finished = false;
  std::vector<Buffer> reduced;               // the answer sent, kept for a redirect
};

}  // namespace

struct Relay::Impl {
  std::mutex mu;  // guards nodes, finished
  std::map<std::pair<uint64_t, size_t>, std::shared_ptr<Node>> nodes;  // (cast id, chunk lo)
  std::deque<std::pair<uint64_t, size_t>> finished;  // oldest first, at most kFinishedKept
  uint64_t id_base = 0;  // random, immutable
  std::atomic<uint64_t> next_id{1};

  uint64_t new_cast_id() {
    return id_base ^ next_id.fetch_add(1, std::memory_order_relaxed);
  }

  static actor::Proc& proc() { return Runtime::get().proc(); }

  // Ranks [lo, hi) answered `reply`; ranks answered before keep their first answer (CT-4).
  // O(ranges) at a relay; the root hands each new range to the sink.
  void fill(const std::shared_ptr<Node>& n, size_t lo, size_t hi, Reply reply) {
    if (lo < n->chunk.lo || hi > n->chunk.hi || lo >= hi) {
      spdlog::warn("podium: cast {}: reply for ranks [{}, {}) outside chunk [{}, {})",
                   n->plan->id, lo, hi, n->chunk.lo, n->chunk.hi);
      return;
    }
    std::vector<Chunk> fresh;
    std::vector<Buffer> answer;
    std::vector<std::string> parents;
    bool root_done = false;
    {
      std::lock_guard lock(n->mu);
      if (n->finished) return;
      fresh = gaps_in(n->pieces, lo, hi);
      if (fresh.empty()) return;
      for (const Chunk& g : fresh) {
        n->remaining -= g.hi - g.lo;
        // The root keeps only which ranks are answered; its values go to the sink.
        n->pieces.emplace(g.lo, Piece{g.hi, n->root ? Reply(std::vector<Buffer>{}) : reply});
      }
      if (n->root) {
        root_done = n->remaining == 0;  // true for exactly one call: the gaps are disjoint
        n->finished = root_done;
      } else {
        if (n->remaining != 0) return;
        n->reduced = encode_runs(n->chunk.lo, n->pieces);
        n->pieces.clear();
        n->finished = true;
        answer = n->reduced;
        parents = n->parent_ports;
      }
    }
    if (n->root) {
      if (n->plan->want_reply) {
        for (const Chunk& g : fresh) {
          n->sink(g.lo, g.hi, reply);
        }
      } else if (!reply) {
        // One-way: the ranks' proc is gone, which its supervisor reports (SV-2).
        spdlog::debug("podium: cast {}: one-way ranks [{}, {}): {}", n->plan->id, lo, hi,
                      reply.error().message);
      }
      if (root_done) finish_root(n);
      return;
    }
    proc().close_port(n->gather_port);
    for (const auto& parent : parents) {
      if (!Runtime::get().proc_dead(std::string(addr_of(parent)))) send_runs(parent, answer);
    }
    std::lock_guard lock(mu);
    finished.emplace_back(n->plan->id, n->chunk.lo);
    while (finished.size() > kFinishedKept) {
      nodes.erase(finished.front());
      finished.pop_front();
    }
  }

  void finish_root(const std::shared_ptr<Node>& n) {
    proc().close_port(n->gather_port);
    std::lock_guard lock(mu);
    nodes.erase({n->plan->id, kRootLo});
  }

  static void send_runs(const std::string& port, std::vector<Buffer> parts) {
    wire::Envelope env;
    env.kind = static_cast<uint8_t>(actor::MessageKind::kReply);
    env.dest = port;
    env.headers.emplace_back(kRunsHeader, "1");
    env.parts = std::move(parts);
    proc().send(std::move(env));
  }

  void on_gather(const std::shared_ptr<Node>& n, wire::Envelope&& env) {
    bool runs = false;
    for (const auto& [k, v] : env.headers) runs |= k == kRunsHeader;
    if (!runs) {
      auto [rank, reply] = decode_reply(std::move(env));
      fill(n, rank, rank + 1, std::move(reply));
      return;
    }
    auto st = decode_runs(env.parts,
                          [&](size_t lo, size_t hi, Reply r) { fill(n, lo, hi, std::move(r)); });
    if (!st) spdlog::error("podium: cast {}: {}", n->plan->id, st.error().to_string());
  }

  void open_gather(const std::shared_ptr<Node>& n) {
    std::weak_ptr<Node> weak = n;
    auto port = proc().open_port(
        [this, weak](wire::Envelope&& env) {
          if (auto node = weak.lock()) on_gather(node, std::move(env));
        },
        false);
    n->gather_port = port.port;
  }

  // Sends chunk `c` to its head's proc, or adopts it at once if that proc is gone.
  void send_child(const std::shared_ptr<Node>& n, Chunk c) {
    const CastPlan& p = *n->plan;
    std::string key(addr_of(p.ports.at(c.lo - n->plan_lo)));
    size_t index = 0;
    {
      std::lock_guard lock(n->mu);
      index = n->children.size();
      n->children.push_back(Node::Child{c, key, false});
    }
    // Registered first: an exit seen from here on reaches this child through proc_gone().
    if (auto dead = Runtime::get().proc_dead(key)) {
      adopt(n, index, *dead);
      return;
    }
    auto addr = channel::Address::parse(key);
    if (!addr) {
      adopt(n, index, addr.error());
      return;
    }
    wire::Envelope env;
    env.kind = static_cast<uint8_t>(actor::MessageKind::kSystem);
    env.dest = system_port_of(key);
    env.sender = p.sender;
    env.fan_out = true;  // the arguments go to other children too: lent, not copied (CH-29)
    // One-way casts gather too (empty acks), so that a dead relay's subtree is re-sent (CT-4).
    std::string parent = proc().port_text(n->gather_port);
    env.parts.reserve(2 + p.args.size());
    env.parts.push_back(actor::encode_system_header(actor::SystemHeader{
        "cast",
        {p.endpoint, p.sender, parent, p.reply_to},
        {p.id, p.fanout, c.lo, c.hi, p.want_reply ? 1u : 0u, p.stream}}));
    env.parts.push_back(encode_plan_part(p, n->plan_lo, c));
    for (const auto& a : p.args) env.parts.push_back(a);
    proc().send(*addr, std::move(env));
  }

  // CT-4: child `index`'s proc is gone; its head rank fails and its children are ours.
  void adopt(const std::shared_ptr<Node>& n, size_t index, const Error& why) {
    Chunk c;
    std::string key;
    {
      std::lock_guard lock(n->mu);
      auto& child = n->children[index];
      if (child.adopted) return;
      child.adopted = true;
      c = child.chunk;
      key = child.proc_key;
    }
    if (!pending_in(n, c)) return;
    spdlog::debug("podium: cast {}: proc {} is gone ({}); ranks [{}, {}) are sent around it",
                  n->plan->id, key, why.message, c.lo + 1, c.hi);
    fill(n, c.lo, c.lo + 1, std::unexpected(why));
    for (Chunk sub : split_chunks(c.lo + 1, c.hi, n->plan->fanout)) {
      if (pending_in(n, sub)) send_child(n, sub);  // a finished grandchild answered already
    }
  }

  static bool pending_in(const std::shared_ptr<Node>& n, Chunk c) {
    std::lock_guard lock(n->mu);
    return !n->finished && !gaps_in(n->pieces, c.lo, c.hi).empty();
  }

  // Delivers the call of rank `rank` (an actor of this proc) with its AC-11 number.
  void deliver(const std::shared_ptr<Node>& n, size_t rank) {
    const CastPlan& p = *n->plan;
    wire::Envelope env;
    env.kind = static_cast<uint8_t>(actor::MessageKind::kCall);
    env.dest = p.ports.at(rank - n->plan_lo);
    env.sender = p.sender;
    env.fan_out = true;  // as for a child (CH-29)
    env.order_stream = p.stream;
    env.order_seq = p.seqs.at(rank - n->plan_lo);
    if (p.want_reply) {
      env.headers.emplace_back(actor::kReplyHeader, proc().port_text(n->gather_port));
    } else if (!p.reply_to.empty()) {
      env.headers.emplace_back(actor::kReplyHeader, p.reply_to);  // a port cast (cast.h CS-1)
    }
    env.parts.reserve(1 + p.args.size());
    env.parts.push_back(actor::encode_call_header(p.endpoint, rank, p.labels, p.sizes));
    for (const auto& a : p.args) env.parts.push_back(a);
    proc().send(std::move(env));
    if (!p.want_reply) fill(n, rank, rank + 1, std::vector<Buffer>{});  // queued is delivered
  }

  std::shared_ptr<Node> make_node(std::shared_ptr<const CastPlan> plan, size_t plan_lo, Chunk c,
                                  bool root) {
    auto n = std::make_shared<Node>();
    n->plan = std::move(plan);
    n->plan_lo = plan_lo;
    n->chunk = c;
    n->root = root;
    n->remaining = c.hi - c.lo;
    return n;
  }
};

Relay::Relay() : impl_(std::make_unique<Impl>()) {
  std::random_device rd;
  impl_->id_base = (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

Relay::~Relay() = default;

void start_tree_cast(Relay& relay, std::shared_ptr<CastPlan> plan,
                     RangeSink sink, actor::Future<Replies> done) {
  auto& impl = relay.impl();
  plan->id = impl.new_cast_id();
  size_t n = plan->ports.size();
  auto node = impl.make_node(plan, 0, Chunk{0, n}, true);
  node->sink = std::move(sink);
  impl.open_gather(node);
  std::pair<uint64_t, size_t> key{plan->id, kRootLo};
  {
    std::lock_guard lock(impl.mu);
    impl.nodes[key] = node;
  }
  // Every rank answered (finish_root), or the caller's collector completed first (ME-2).
  if (done.valid()) {
    Relay::Impl* raw = &impl;
    done.on_ready([raw, key, port = node->gather_port](const Result<Replies>&) {
      Relay::Impl::proc().close_port(port);
      std::lock_guard lock(raw->mu);
      raw->nodes.erase(key);
    });
  }
  for (Chunk c : split_chunks(0, n, plan->fanout)) impl.send_child(node, c);
}

// "cast" [endpoint, sender, parent port, reply-to port] [cast id, fanout, lo, hi, want reply,
// stream],
// part 1 = the plan of [lo, hi), parts 2.. = the call's arguments.
void Relay::on_cast(const actor::SystemHeader& h, wire::Envelope&& env) {
  if (h.args.size() != 4 || h.numbers.size() != 6 || env.parts.size() < 2 ||
      h.numbers[3] <= h.numbers[2] || h.numbers[1] == 0) {
    spdlog::error("podium: malformed cast from {}", env.sender);
    return;
  }
  auto plan = std::make_shared<CastPlan>();
  plan->id = h.numbers[0];
  plan->fanout = h.numbers[1];
  Chunk c{h.numbers[2], h.numbers[3]};
  plan->want_reply = h.numbers[4] != 0;
  plan->stream = h.numbers[5];
  plan->endpoint = h.args[0];
  plan->sender = h.args[1];
  const std::string& parent = h.args[2];
  if (!plan->want_reply) plan->reply_to = h.args[3];
  std::pair<uint64_t, size_t> key{plan->id, c.lo};
  {
    std::shared_ptr<Node> seen;
    {
      std::lock_guard lock(impl_->mu);
      if (auto it = impl_->nodes.find(key); it != impl_->nodes.end()) seen = it->second;
    }
    if (seen) {  // CT-4: sent again by a new parent
      std::vector<Buffer> answer;
      {
        std::lock_guard lock(seen->mu);
        seen->parent_ports.push_back(parent);
        if (!seen->finished) return;
        answer = seen->reduced;
      }
      Impl::send_runs(parent, std::move(answer));
      return;
    }
  }
  if (auto st = decode_plan_part(env.parts[1], c.hi - c.lo, *plan); !st) {
    std::string why = st.error().to_string();
    spdlog::error("podium: cast {} from {}: {}", plan->id, env.sender, why);
    {
      // The parent learns that every rank of the chunk failed, rather than waiting.
      Pieces all;
      all.emplace(c.lo, Piece{c.hi, Reply(std::unexpected(relay_error(why)))});
      Impl::send_runs(parent, encode_runs(c.lo, all));
    }
    return;
  }
  plan->args.assign(std::make_move_iterator(env.parts.begin() + 2),
                    std::make_move_iterator(env.parts.end()));
  auto node = impl_->make_node(plan, c.lo, c, false);
  node->parent_ports.push_back(parent);
  impl_->open_gather(node);
  {
    std::lock_guard lock(impl_->mu);
    impl_->nodes[key] = node;
  }
  for (Chunk sub : split_chunks(c.lo + 1, c.hi, plan->fanout)) impl_->send_child(node, sub);
  impl_->deliver(node, c.lo);
}

void Relay::proc_gone(const std::string& proc_key, const Error& why) {
  std::vector<std::shared_ptr<Node>> live;
  {
    std::lock_guard lock(impl_->mu);
    for (auto& [k, n] : impl_->nodes) live.push_back(n);
  }
  for (auto& n : live) {
    std::vector<size_t> hit;
    {
      std::lock_guard lock(n->mu);
      if (n->finished) continue;
      for (size_t i = 0; i < n->children.size(); ++i) {
        if (!n->children[i].adopted && n->children[i].proc_key == proc_key) hit.push_back(i);
      }
    }
    for (size_t i : hit) impl_->adopt(n, i, why);
  }
}

}  // namespace podium::mesh
