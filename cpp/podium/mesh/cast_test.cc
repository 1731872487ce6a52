// End-to-end tests of the cast tree (relay.h): 64 real procs spawned from this binary, casts
// with small fan-outs so that trees are deep, ordering against direct sends (AC-11), and procs
// killed inside the tree (CT-4).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include "podium/actor/port_receiver.h"
#include "podium/actor/proc.h"
#include "podium/mesh/actor_mesh.h"
#include "podium/mesh/relay.h"

namespace {

using namespace std::chrono_literals;

class Node : public podium::Actor {
 public:
  Node() = default;
  int64_t where() { return static_cast<int64_t>(rank()) * 1000000 + ::getpid() % 1000000; }
  int same() { return 7; }
  // Ordering: the values one sender sends must arrive increasing.
  void seen(int i) {
    if (i <= last_) out_of_order_ = true;
    last_ = i;
    ++count_;
  }
  int64_t seen_count() { return out_of_order_ ? -1 : count_; }
  int slow(int ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return ms;
  }
  // Throws on ranks in [lo, hi): errors inside the tree, merged into runs of equal errors.
  int fail_between(int lo, int hi) {
    int r = static_cast<int>(rank());
    if (r >= lo && r < hi) throw std::runtime_error("refused");
    return 1;
  }
  PODIUM_ENDPOINTS(Node, where, same, seen, seen_count, slow, fail_between)

 private:
  int last_ = -1;
  int64_t count_ = 0;
  bool out_of_order_ = false;
};
PODIUM_ACTOR(Node)

template <class T>
T ok(podium::Result<T> r) {
  EXPECT_TRUE(r) << r.error().to_string();
  if (!r) throw std::runtime_error(r.error().to_string());
  return std::move(*r);
}

// The mesh every test uses: 64 procs as {"hosts": 8, "gpus": 8}, spawned once.
struct Fixture {
  std::optional<podium::ProcMesh> procs;
  std::optional<podium::ActorMesh<Node>> nodes;
};
Fixture* g_fx = nullptr;

class CastTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_fx = new Fixture;
    g_fx->procs.emplace(ok(podium::this_host().spawn_procs({{"hosts", 8}, {"gpus", 8}})));
    ASSERT_TRUE(g_fx->procs->initialized().get(60s));
    g_fx->nodes.emplace(ok(g_fx->procs->spawn<Node>("node")));
    auto init = g_fx->nodes->initialized().get(60s);
    ASSERT_TRUE(init) << init.error().to_string();
  }
  static void TearDownTestSuite() {
    if (g_fx && g_fx->procs) {
      EXPECT_TRUE(g_fx->procs->stop(2000ms).get(20s));
    }
    delete g_fx;
    g_fx = nullptr;
  }
  void SetUp() override { podium::mesh::set_cast_fanout(4); }
  void TearDown() override { podium::mesh::set_cast_fanout(podium::mesh::kDefaultCastFanout); }
  podium::ActorMesh<Node>& nodes() { return *g_fx->nodes; }
};

TEST(CastShape, ChunksCoverTheRangeInOrder) {  // CT-2
  auto c = podium::mesh::split_chunks(1, 64, 16);
  ASSERT_EQ(c.size(), 16u);
  size_t next = 1;
  for (auto ch : c) {
    EXPECT_EQ(ch.lo, next);
    EXPECT_GE(ch.hi - ch.lo, 3u);
    EXPECT_LE(ch.hi - ch.lo, 4u);
    next = ch.hi;
  }
  EXPECT_EQ(next, 64u);
  EXPECT_EQ(podium::mesh::split_chunks(0, 3, 16).size(), 3u);
  EXPECT_TRUE(podium::mesh::split_chunks(5, 5, 16).empty());
}

podium::mesh::Reply value_reply(std::string_view text) {
  return podium::mesh::Reply(std::vector<podium::Buffer>{podium::Buffer::copy_of(
      std::span(reinterpret_cast<const std::byte*>(text.data()), text.size()))});
}

TEST(CastReplies, EqualNeighboursAreOneRunAndEveryRankIsFound) {  // ME-9
  podium::mesh::Replies r;
  r.append(3, value_reply("a"));
  r.append(2, value_reply("a"));  // byte-equal, separate buffers: the run grows
  r.append(1, podium::mesh::Reply(std::unexpected(podium::make_error(
                  podium::BaseErrc::kInvalidArgument, "no"))));
  r.append(4, value_reply("b"));
  r.append(0, value_reply("c"));  // no ranks: nothing
  ASSERT_EQ(r.size(), 10u);
  ASSERT_EQ(r.runs(), 3u);
  EXPECT_EQ(r.run_begin(1), 5u);
  EXPECT_EQ(r.run_end(1), 6u);
  for (size_t k = 0; k < 10; ++k) EXPECT_EQ(r[k].has_value(), k != 5) << "rank " << k;
  EXPECT_TRUE(podium::mesh::same_reply(r[9], value_reply("b")));
  auto bad = r.first_error();
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->first, 5u);
  EXPECT_EQ(bad->second->message, "no");
}

TEST(CastReplies, CollectorFillsOnlyGapsAndCompletesOnceAsRuns) {  // ME-1, ME-9
  std::vector<std::string> keys(100, "p0");
  keys[42] = "p1";
  podium::mesh::Collector c(keys);
  c.fill_range(10, 50, value_reply("x"));
  c.fill_range(0, 20, value_reply("y"));   // [10, 20) is taken already: only [0, 10) fills
  c.fill_range(30, 40, value_reply("z"));  // a late duplicate: nothing changes
  EXPECT_TRUE(c.filled(45));
  EXPECT_FALSE(c.filled(50));
  c.proc_failed("p1", podium::make_error(podium::BaseErrc::kInvalidArgument, "gone"));
  EXPECT_FALSE(c.future().ready());
  c.fill_range(50, 120, value_reply("x"));  // past the end is clipped
  ASSERT_TRUE(c.future().ready());
  auto r = *c.future().get(1s);
  ASSERT_EQ(r.size(), 100u);
  ASSERT_EQ(r.runs(), 2u);  // [0, 10) y, then x everywhere: 42 was answered before it failed
  EXPECT_TRUE(podium::mesh::same_reply(r[5], value_reply("y")));
  EXPECT_TRUE(podium::mesh::same_reply(r[42], value_reply("x")));
  EXPECT_TRUE(podium::mesh::same_reply(r[99], value_reply("x")));
  c.fill_range(0, 100, value_reply("w"));  // after completion: ignored
}

TEST(CastReplies, ValueMeshHoldsRunsAndSpellsOutEveryRank) {  // ME-9
  auto extent = ok(podium::ndslice::Extent::make({"hosts", "gpus"}, {2, 3}));
  podium::ValueMesh<int> v(extent);
  v.append(4, 7);
  v.append(2, 9);
  EXPECT_EQ(v.size(), 6u);
  EXPECT_EQ(v.runs(), 2u);
  EXPECT_EQ(v.values(), (std::vector<int>{7, 7, 7, 7, 9, 9}));
  EXPECT_EQ(v[3], 7);
  EXPECT_EQ(v[4], 9);
  auto row = ok(v.slice("hosts", 1));
  EXPECT_EQ(row.values(), (std::vector<int>{7, 9, 9}));
  EXPECT_EQ(v.items().size(), 6u);
  podium::ValueMesh<int> from_list(extent, {1, 1, 2, 2, 2, 1});
  EXPECT_EQ(from_list.runs(), 3u);
  EXPECT_EQ(from_list.values(), (std::vector<int>{1, 1, 2, 2, 2, 1}));
}

// The target: at 256 procs the controller sends and receives at most k + 1 messages per
// call, with the default fan-out.
TEST(CastScale, TwoHundredFiftySixProcsCostTheControllerAtMostFanoutPlusOne) {  // CT-1
  podium::mesh::set_cast_fanout(podium::mesh::kDefaultCastFanout);
  auto procs = ok(podium::this_host().spawn_procs({{"procs", 256}}));
  ASSERT_TRUE(procs.initialized().get(120s));
  auto nodes = ok(procs.spawn<Node>("wide"));
  ASSERT_TRUE(nodes.initialized().get(120s));
  auto& proc = podium::mesh::Runtime::get().proc();
  const uint64_t k = podium::mesh::kDefaultCastFanout;
  for (int i = 0; i < 3; ++i) {
    auto before = proc.traffic();
    auto v = ok(nodes.call(&Node::where).get(60s));
    auto after = proc.traffic();
    ASSERT_EQ(v.size(), 256u);
    for (size_t r = 0; r < 256; ++r) ASSERT_EQ(v[r] / 1000000, static_cast<int64_t>(r));
    EXPECT_LE(after.sent - before.sent, k + 1);
    EXPECT_LE(after.received - before.received, k + 1);
  }
  EXPECT_TRUE(procs.stop(2000ms).get(60s));
}

TEST_F(CastTest, EveryRankAnswersInRankOrderThroughTheTree) {  // CT-3, ME-1
  for (size_t k : {2u, 4u, 16u}) {
    podium::mesh::set_cast_fanout(k);
    auto v = ok(nodes().call(&Node::where).get(20s));
    ASSERT_EQ(v.size(), 64u);
    for (size_t r = 0; r < 64; ++r) {
      EXPECT_EQ(v[r] / 1000000, static_cast<int64_t>(r)) << "fanout " << k;
      EXPECT_EQ(v[r] % 1000000, g_fx->procs->pid(r) % 1000000) << "fanout " << k;
    }
  }
}

TEST_F(CastTest, ControllerSendsAndReceivesAtMostFanoutMessages) {  // CT-1
  auto& proc = podium::mesh::Runtime::get().proc();
  for (size_t k : {4u, 16u}) {
    podium::mesh::set_cast_fanout(k);
    for (int i = 0; i < 5; ++i) {
      auto before = proc.traffic();
      auto v = ok(nodes().call(&Node::same).get(20s));
      auto after = proc.traffic();
      ASSERT_EQ(v.size(), 64u);
      EXPECT_EQ(v.runs(), 1u);  // ME-9: equal replies reach the caller as one run
      for (size_t r = 0; r < 64; ++r) EXPECT_EQ(v[r], 7);
      EXPECT_LE(after.sent - before.sent, k + 1) << "fanout " << k;
      EXPECT_LE(after.received - before.received, k + 1) << "fanout " << k;
    }
  }
}

TEST_F(CastTest, PortCastsGoThroughTheTreeAndEveryActorAnswersThePort) {  // CS-1, CT-1
  auto& proc = podium::mesh::Runtime::get().proc();
  podium::actor::PortReceiver rx(proc, false);
  auto none = podium::detail::pack(std::tuple<>());
  for (size_t k : {4u, 16u}) {
    podium::mesh::set_cast_fanout(k);
    auto before = proc.traffic();
    ASSERT_TRUE(nodes().cast_to_port("where", {none}, rx.port_id()));
    std::set<int64_t> ranks;
    for (int i = 0; i < 64; ++i) {
      auto m = rx.recv().get(20s);
      ASSERT_TRUE(m) << m.error().to_string();
      auto v = ok(podium::detail::unpack<int64_t>(m->at(0), "where"));
      EXPECT_EQ(v % 1000000, g_fx->procs->pid(v / 1000000) % 1000000);
      ranks.insert(v / 1000000);
    }
    auto after = proc.traffic();
    EXPECT_EQ(ranks.size(), 64u);
    EXPECT_EQ(*ranks.begin(), 0);
    EXPECT_EQ(*ranks.rbegin(), 63);
    // The sender sent the tree's k chunks, not one call per actor.
    EXPECT_LE(after.sent - before.sent, k + 1) << "fanout " << k;
  }
  // One rank alone, as a mesh of no dimensions (its rank there is 0).
  ASSERT_TRUE(nodes().cast_to_port("where", {none}, rx.port_id(), 37));
  auto m = rx.recv().get(20s);
  ASSERT_TRUE(m) << m.error().to_string();
  auto v = ok(podium::detail::unpack<int64_t>(m->at(0), "where"));
  EXPECT_EQ(v / 1000000, 0);
  EXPECT_EQ(v % 1000000, g_fx->procs->pid(37) % 1000000);
  auto bad = nodes().cast_to_port("where", {none}, rx.port_id(), 64);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().subsystem, podium::Subsystem::kNdslice);
}

TEST_F(CastTest, PortCastErrorsReachThePortForTheirRanks) {  // CS-1
  podium::mesh::set_cast_fanout(2);
  podium::actor::PortReceiver rx(podium::mesh::Runtime::get().proc(), false);
  auto args = podium::detail::pack(std::tuple<int, int>(0, 64));
  ASSERT_TRUE(nodes().cast_to_port("fail_between", {args}, rx.port_id()));
  for (int i = 0; i < 64; ++i) {
    auto m = rx.recv().get(20s);
    ASSERT_FALSE(m);
    EXPECT_NE(m.error().message.find("refused"), std::string::npos) << m.error().message;
  }
}

TEST_F(CastTest, StreamHandsRepliesOutInArrivalOrder) {  // CS-2
  auto four = ok(ok(nodes().slice("hosts", 0)).slice("gpus", podium::ndslice::Range{0, 4, 1}));
  std::vector<std::vector<podium::Buffer>> per_rank;
  for (int ms : {1500, 0, 0, 0}) per_rank.push_back({podium::detail::pack(std::tuple<int>(ms))});
  auto stream = ok(four.stream_raw("slow", std::move(per_rank)));
  auto futures = stream->futures();
  ASSERT_EQ(futures.size(), 4u);
  std::set<size_t> fast;
  for (size_t k = 0; k < 3; ++k) {
    auto r = futures[k].get(20s);
    ASSERT_TRUE(r) << r.error().to_string();
    auto rank = stream->rank(k);
    ASSERT_TRUE(rank);
    fast.insert(*rank);
    EXPECT_EQ(ok(podium::detail::unpack<int>(ok(podium::mesh::Reply((*r)[0])).at(0), "ms")), 0);
  }
  EXPECT_EQ(fast, (std::set<size_t>{1, 2, 3}));
  auto last = futures[3].get(20s);
  ASSERT_TRUE(last) << last.error().to_string();
  EXPECT_EQ(stream->rank(3), std::optional<size_t>(0));
  // One argument list per rank, or nothing is called.
  auto wrong = four.stream_raw("slow", {});
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.error().code, static_cast<uint16_t>(podium::BaseErrc::kInvalidArgument));
}

TEST_F(CastTest, HandlerErrorsComeBackForTheirRanksOnly) {  // CT-3
  podium::mesh::set_cast_fanout(2);
  auto args = podium::detail::pack(std::tuple<int, int>(5, 9));
  auto replies = ok(nodes().call_raw("fail_between", {args}).get(20s));
  ASSERT_EQ(replies.size(), 64u);
  // ok, then the four errors (each names its own actor, so none equals another), then ok.
  EXPECT_EQ(replies.runs(), 6u);
  for (size_t r = 0; r < 64; ++r) {
    if (r >= 5 && r < 9) {
      ASSERT_FALSE(replies[r]) << "rank " << r;
      EXPECT_NE(replies[r].error().message.find("refused"), std::string::npos);
    } else {
      ASSERT_TRUE(replies[r]) << "rank " << r << ": " << replies[r].error().to_string();
    }
  }
  // The actors live on (an endpoint exception is not a failure).
  auto v = ok(nodes().call(&Node::same).get(20s));
  EXPECT_EQ(v.size(), 64u);
}

TEST_F(CastTest, StridedAndMultiDimSlices) {
  podium::mesh::set_cast_fanout(2);
  // hosts 1, 3, 5, 7 x gpus 0, 3, 6: 12 ranks, neither contiguous nor one-dimensional.
  auto sub = ok(nodes().slice("hosts", podium::ndslice::Range{1, std::nullopt, 2}));
  sub = ok(sub.slice("gpus", podium::ndslice::Range{0, std::nullopt, 3}));
  ASSERT_EQ(sub.size(), 12u);
  auto v = ok(sub.call(&Node::where).get(20s));
  ASSERT_EQ(v.size(), 12u);
  auto base = sub.region().base_ranks();
  for (size_t r = 0; r < 12; ++r) {
    EXPECT_EQ(v[r] / 1000000, static_cast<int64_t>(r));  // the rank within the slice
    EXPECT_EQ(v[r] % 1000000, g_fx->procs->pid(base[r]) % 1000000) << "rank " << r;
  }
  // One host row: a single dimension with a stride of 1 after the cut.
  auto row = ok(nodes().slice("hosts", 6));
  auto w = ok(row.call(&Node::where).get(20s));
  ASSERT_EQ(w.size(), 8u);
  for (size_t r = 0; r < 8; ++r) {
    EXPECT_EQ(w[r] % 1000000, g_fx->procs->pid(48 + r) % 1000000);
  }
}

// Thousands of casts (through trees of fan-out 2, 3 and 4 levels deep) interleaved with direct
// sends to single actors, from one sender: every actor sees the sender's values increasing.
void interleave(const podium::ActorMesh<Node>& mesh, int n, uint32_t seed,
                std::vector<int64_t>* expected) {
  std::mt19937 rng(seed);
  for (int i = 0; i < n; ++i) {
    auto pick = rng() % 3;
    if (pick == 0) {
      if (!mesh.broadcast(&Node::seen, i)) throw std::runtime_error("broadcast failed");
      for (auto& e : *expected) ++e;
    } else {
      size_t r = rng() % mesh.size();
      auto one = mesh.slice("hosts", static_cast<int64_t>(r / 8));
      if (!one) throw std::runtime_error(one.error().to_string());
      auto cell = one->slice("gpus", static_cast<int64_t>(r % 8));
      if (!cell) throw std::runtime_error(cell.error().to_string());
      if (!cell->broadcast(&Node::seen, i)) throw std::runtime_error("send failed");
      ++(*expected)[r];
    }
  }
}

TEST_F(CastTest, CastsAndDirectSendsKeepSenderOrder) {  // AC-11
  podium::mesh::set_cast_fanout(2);
  auto fresh = ok(g_fx->procs->spawn<Node>("order"));
  ASSERT_TRUE(fresh.initialized().get(30s));
  std::vector<int64_t> expected(64, 0);
  interleave(fresh, 3000, 1, &expected);
  auto v = ok(fresh.call(&Node::seen_count).get(60s));
  for (size_t r = 0; r < 64; ++r) EXPECT_EQ(v[r], expected[r]) << "rank " << r;
}

// Casts to a strided two-dimensional slice, to the whole mesh and to single actors, interleaved:
// the slice's rank tables are a few port runs, and its AC-11 numbers differ from rank to rank
// (several seq runs), so each chunk's tables are cut at run boundaries (CP-1, CP-2).
TEST_F(CastTest, StridedSliceCastsAmongDirectSendsKeepOrder) {  // AC-11, CP-1, CP-2
  podium::mesh::set_cast_fanout(2);
  auto fresh = ok(g_fx->procs->spawn<Node>("order_slice"));
  ASSERT_TRUE(fresh.initialized().get(30s));
  auto sub = ok(fresh.slice("hosts", podium::ndslice::Range{1, std::nullopt, 2}));
  sub = ok(sub.slice("gpus", podium::ndslice::Range{0, std::nullopt, 3}));
  ASSERT_EQ(sub.size(), 12u);
  auto base = sub.region().base_ranks();
  std::vector<int64_t> expected(64, 0);
  std::mt19937 rng(3);
  for (int i = 0; i < 1500; ++i) {
    auto pick = rng() % 4;
    if (pick == 0) {
      ASSERT_TRUE(fresh.broadcast(&Node::seen, i));
      for (auto& e : expected) ++e;
    } else if (pick == 1) {
      ASSERT_TRUE(sub.broadcast(&Node::seen, i));
      for (size_t b : base) ++expected[b];
    } else {
      size_t r = rng() % 64;
      auto cell = ok(ok(fresh.slice("hosts", static_cast<int64_t>(r / 8)))
                         .slice("gpus", static_cast<int64_t>(r % 8)));
      ASSERT_TRUE(cell.broadcast(&Node::seen, i));
      ++expected[r];
    }
  }
  auto v = ok(fresh.call(&Node::seen_count).get(60s));
  for (size_t r = 0; r < 64; ++r) EXPECT_EQ(v[r], expected[r]) << "rank " << r;
  // A call on the slice answers for its ranks, in slice order, through the tree.
  auto w = ok(sub.call(&Node::where).get(20s));
  for (size_t r = 0; r < 12; ++r) {
    EXPECT_EQ(w[r] % 1000000, g_fx->procs->pid(base[r]) % 1000000) << "rank " << r;
  }
}

// The same from an actor: a driver in the controller's proc sends; its stream is its own.
class Driver : public podium::Actor {
 public:
  Driver() = default;
  int64_t drive(int n) {
    std::vector<int64_t> expected(64, 0);
    interleave(*mesh_, n, 7, &expected);
    int64_t total = 0;
    for (auto e : expected) total += e;
    return total;
  }
  PODIUM_ENDPOINTS(Driver, drive)
  static inline std::optional<podium::ActorMesh<Node>> mesh_;
};
PODIUM_ACTOR(Driver)

TEST_F(CastTest, CastsFromAnActorKeepSenderOrder) {  // AC-11
  podium::mesh::set_cast_fanout(2);
  auto fresh = ok(g_fx->procs->spawn<Node>("order_actor"));
  ASSERT_TRUE(fresh.initialized().get(30s));
  Driver::mesh_.emplace(fresh);
  auto driver = ok(podium::this_proc().spawn<Driver>("driver"));
  ASSERT_TRUE(driver.initialized().get(10s));
  auto total = ok(driver.call_one(&Driver::drive, 2000).get(60s));
  // The driver's one-way sends are not ordered with this thread's calls: wait for them all.
  int64_t sum = 0;
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto v = ok(fresh.call(&Node::seen_count).get(60s));
    sum = 0;
    for (size_t r = 0; r < 64; ++r) {
      ASSERT_GE(v[r], 0) << "rank " << r << " saw a call out of order";
      sum += v[r];
    }
    if (sum == total) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(sum, total);
  Driver::mesh_.reset();
  EXPECT_TRUE(driver.stop().get(10s));
}

// Last: it kills procs. With fan-out 2, rank 1 relays ranks 2..16 (CT-2).
TEST_F(CastTest, DeadRelaysDoNotStallTheCast) {  // CT-4, ME-2
  podium::mesh::set_cast_fanout(2);
  auto ms = podium::detail::pack(std::tuple<int>(400));
  // Killed while the cast is in flight: its subtree is re-sent around it.
  auto pending = nodes().call_raw("slow", {ms});
  std::this_thread::sleep_for(100ms);
  ASSERT_EQ(::kill(g_fx->procs->pid(1), SIGKILL), 0);
  auto replies = ok(pending.get(20s));
  ASSERT_EQ(replies.size(), 64u);
  for (size_t r = 0; r < 64; ++r) {
    if (r == 1) {
      ASSERT_FALSE(replies[r]);
      EXPECT_NE(replies[r].error().message.find("SIGKILL"), std::string::npos)
          << replies[r].error().message;
    } else {
      EXPECT_TRUE(replies[r]) << "rank " << r << ": " << replies[r].error().to_string();
    }
  }
  // Known dead before the cast (and a second relay, rank 17, killed now): routed around.
  ASSERT_EQ(::kill(g_fx->procs->pid(17), SIGKILL), 0);
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!g_fx->procs->exit_status(17) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  auto again = ok(nodes().call_raw("same", {podium::detail::pack(std::tuple<>())}).get(20s));
  for (size_t r = 0; r < 64; ++r) {
    EXPECT_EQ(static_cast<bool>(again[r]), r != 1 && r != 17) << "rank " << r;
  }
  // One-way casts go around the dead relays too, and later calls from the same sender are not
  // held back waiting for them (AC-11).
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(nodes().broadcast(&Node::seen, 100 + i));
  auto t0 = std::chrono::steady_clock::now();
  auto counts = ok(nodes().call_raw("seen_count", {podium::detail::pack(std::tuple<>())}).get(20s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  for (size_t r = 0; r < 64; ++r) {
    if (r == 1 || r == 17) continue;
    ASSERT_TRUE(counts[r]) << "rank " << r;
    EXPECT_EQ(podium::detail::unpack<int64_t>(counts[r]->at(0), "count").value_or(-1), 3)
        << "rank " << r;
  }
  // The typed call names the failed rank as supervision does.
  auto typed = nodes().call(&Node::same).get(20s);
  ASSERT_FALSE(typed);
  EXPECT_NE(typed.error().message.find("actor node[1] of mesh 'node' (rank 1"), std::string::npos)
      << typed.error().message;
}

}  // namespace

int main(int argc, char** argv) {
  // Up to 256 procs share the cores: they sleep in epoll_wait instead of polling after each
  // message (the procs read this when they start).
  ::setenv("PODIUM_POLL_US", "0", 0);
  podium::init(argc, argv);  // spawned procs serve here and never return
  // Killed procs are failures of meshes this controller owns; the test expects them.
  podium::set_unhandled_fault_handler([](podium::actor::MeshFailure) {});
  ::testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  podium::shutdown();
  return rc;
}
