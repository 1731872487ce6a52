// AC-11's ends alone, on virtual time (base::ManualClock): no test here sleeps.
#include "podium/actor/ordering.h"

#include <gtest/gtest.h>

#include <asio/io_context.hpp>
#include <string>
#include <vector>

#include "podium/actor/message.h"

namespace podium::actor {
namespace {

using namespace std::chrono_literals;

wire::Envelope call(uint64_t stream, uint64_t seq, std::string sender = "unix:@s#a[0]") {
  wire::Envelope env;
  env.kind = static_cast<uint8_t>(MessageKind::kCall);
  env.dest = "unix:@r#b[0]:0";
  env.sender = std::move(sender);
  env.order_stream = stream;
  env.order_seq = seq;
  return env;
}

struct Fixture {
  asio::io_context io;
  std::shared_ptr<base::ManualClock> clock = std::make_shared<base::ManualClock>();
  std::vector<uint64_t> got;
  OrderedInbox inbox{io, clock, std::chrono::seconds(10),
                     [this](wire::Envelope&& env) { got.push_back(env.order_seq); }};
};

// AC-11: calls are delivered in number order, early ones held, duplicates dropped.
TEST(OrderingTest, HoldsEarlyCallsAndDropsDuplicates) {
  Fixture f;
  f.inbox.route(call(7, 2));
  f.inbox.route(call(7, 3));
  EXPECT_TRUE(f.got.empty());
  EXPECT_EQ(f.inbox.held_count(), 2u);
  f.inbox.route(call(7, 1));
  EXPECT_EQ(f.got, (std::vector<uint64_t>{1, 2, 3}));
  f.inbox.route(call(7, 2));  // a duplicate (a cast tree re-sent it)
  EXPECT_EQ(f.got.size(), 3u);
  EXPECT_EQ(f.clock->pending(), 0u) << "the gap closed: no timer left";
}

// AC-11 on virtual time: a gap left unfilled for kOrderGapTimeout is skipped, and not a
// moment before; advance() releases it with no wall-clock wait (CK-2).
TEST(OrderingTest, GapReleasesAfterTimeoutOnVirtualTime) {
  Fixture f;
  f.inbox.route(call(7, 1));
  f.inbox.route(call(7, 3));
  f.inbox.route(call(7, 4));
  EXPECT_EQ(f.got, (std::vector<uint64_t>{1}));
  f.clock->advance(9s);
  EXPECT_EQ(f.got, (std::vector<uint64_t>{1}));
  f.clock->advance(1s);
  EXPECT_EQ(f.got, (std::vector<uint64_t>{1, 3, 4}));
  f.inbox.route(call(7, 2));  // late: a duplicate of what was skipped
  EXPECT_EQ(f.got.size(), 3u);
  EXPECT_EQ(f.clock->pending(), 0u);
}

// AC-11: the timer measures from the gap it watches: a gap that moves (the first one filled,
// a second one left) waits its own full timeout.
TEST(OrderingTest, SecondGapWaitsItsOwnTimeout) {
  Fixture f;
  f.inbox.route(call(7, 2));
  f.inbox.route(call(7, 4));
  f.clock->advance(6s);
  f.inbox.route(call(7, 1));  // fills the first gap; 3 is still missing
  EXPECT_EQ(f.got, (std::vector<uint64_t>{1, 2}));
  f.clock->advance(4s);  // the timer armed for the first gap fires, finds progress, re-arms
  EXPECT_EQ(f.got, (std::vector<uint64_t>{1, 2}));
  f.clock->advance(10s);
  EXPECT_EQ(f.got, (std::vector<uint64_t>{1, 2, 4}));
}

// AC-16: the streams of a process that ended go, and what they held is delivered, not
// dropped; streams of other senders stay.
TEST(OrderingTest, ForgetSendersDropsTheirStreams) {
  Fixture f;
  f.inbox.route(call(7, 1, "unix:@gone#a[0]"));
  f.inbox.route(call(7, 3, "unix:@gone#a[0]"));
  f.inbox.route(call(8, 1, "unix:@gone"));  // the proc itself, outside an actor
  f.inbox.route(call(9, 1, "unix:@alive#a[0]"));
  EXPECT_EQ(f.inbox.stream_count(), 3u);
  std::string gone = "unix:@gone";
  f.inbox.forget_senders(std::span<const std::string>(&gone, 1));
  EXPECT_EQ(f.inbox.stream_count(), 1u);
  EXPECT_EQ(f.got, (std::vector<uint64_t>{1, 1, 1, 3}));
  EXPECT_EQ(f.inbox.held_count(), 0u);
  f.clock->advance(20s);  // the cancelled gap timer never runs as expired (CK-3)
  EXPECT_EQ(f.got.size(), 4u);
}

TEST(OrderingTest, ProcOfSenderTexts) {
  EXPECT_EQ(proc_of("unix:@p#a[0]"), "unix:@p");
  EXPECT_EQ(proc_of("tcp:h:1/ab#a[3]:0"), "tcp:h:1/ab");
  EXPECT_EQ(proc_of("unix:@p"), "unix:@p");
  EXPECT_EQ(proc_of("unix:/tmp/x#y"), "unix:/tmp/x#y");  // '#' in a path, no actor
}

// AC-16, sender side: a stream's counters go with forget_stream(); dests of ended procs
// with forget_dests().
TEST(OrderingTest, SeqCountersForget) {
  SeqCounters c;
  uint64_t out = 0;
  c.next_seqs(1, {}, "unix:@p#a[0]:0", &out);
  EXPECT_EQ(out, 1u);
  c.next_seqs(1, {}, "unix:@p#a[0]:0", &out);
  EXPECT_EQ(out, 2u);
  c.next_seqs(2, {}, "unix:@q#a[0]:0", &out);
  EXPECT_EQ(c.stream_count(), 2u);
  c.forget_stream(1);
  EXPECT_EQ(c.stream_count(), 1u);
  std::string q = "unix:@q";
  c.forget_dests(std::span<const std::string>(&q, 1));
  EXPECT_EQ(c.stream_count(), 0u);
}

}  // namespace
}  // namespace podium::actor
