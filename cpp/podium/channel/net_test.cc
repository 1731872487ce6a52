#include "podium/channel/net.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <fstream>

#include "podium/channel/test_util.h"

namespace podium::channel {
namespace {

using namespace testing;

enum class Kind { kInproc, kUnix, kAbstract, kTcp };

std::string kind_name(const ::testing::TestParamInfo<Kind>& info) {
  switch (info.param) {
    case Kind::kInproc: return "Inproc";
    case Kind::kUnix: return "Unix";
    case Kind::kAbstract: return "Abstract";
    case Kind::kTcp: return "Tcp";
  }
  return "?";
}

Address listen_address(Kind kind, const TempDir& dir) {
  switch (kind) {
    case Kind::kInproc: return *Address::parse("inproc:" + unique_name("net"));
    case Kind::kUnix: return *Address::parse("unix:" + dir.path("r.sock"));
    case Kind::kAbstract: return *Address::parse("unix:@" + unique_name("net"));
    case Kind::kTcp: return *Address::parse("tcp:127.0.0.1:0");
  }
  return {};
}

// A loopback TCP port nobody listens on now (bound once by the kernel's choice, released).
uint16_t free_tcp_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), len), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len), 0);
  ::close(fd);
  return ntohs(sa.sin_port);
}

// A receiving Net and a sending Net, each on its own io_context run by `threads` threads.
struct Pair {
  explicit Pair(Kind kind, int threads = 2, Config config = test_config())
      : rx_io(threads), tx_io(threads),
        rx(rx_io.io(), config, receiver.fn(), rx_returns.fn()),
        tx(tx_io.io(), config, [](wire::Envelope&&) { ADD_FAILURE() << "tx got an envelope"; },
           returns.fn()) {
    auto bound = rx.listen(listen_address(kind, dir));
    EXPECT_TRUE(bound) << bound.error().to_string();
    if (bound) to = *bound;
  }
  TempDir dir;
  Receiver receiver;
  Returns rx_returns, returns;
  IoThreads rx_io, tx_io;
  Net rx, tx;
  Address to;
};

class ChannelNetTransport : public ::testing::TestWithParam<Kind> {};

TEST_P(ChannelNetTransport, DeliversInOrderWithTwoIoThreads) {  // CH-1, CH-4
  Pair p(GetParam());
  constexpr uint64_t kCount = 20000;
  for (uint64_t i = 0; i < kCount; ++i) p.tx.send(p.to, numbered(i, 1000));
  ASSERT_TRUE(p.receiver.wait_for(kCount, 30s)) << p.receiver.count() << " arrived";
  EXPECT_EQ(p.receiver.error(), "");
  EXPECT_EQ(p.returns.size(), 0u);
}

TEST_P(ChannelNetTransport, SendsUnderFlushLaterArriveWithoutALaterSend) {  // CH-7
  Config c = test_config();
  c.flush_later_delay = 200us;
  Pair p(GetParam(), 2, c);
  p.tx.send(p.to, numbered(0, 10));  // connects the link
  ASSERT_TRUE(p.receiver.wait_for(1, 10s));
  {
    FlushLater later;
    EXPECT_TRUE(FlushLater::active());
    // Fewer than the frame cap and no send after them: only the timer writes them.
    for (uint64_t i = 1; i <= 10; ++i) p.tx.send(p.to, numbered(i, 10));
  }
  EXPECT_FALSE(FlushLater::active());
  ASSERT_TRUE(p.receiver.wait_for(11, 10s)) << p.receiver.count() << " arrived";
  {
    FlushLater later;  // past the cap: written as they go, in order
    for (uint64_t i = 11; i <= 500; ++i) p.tx.send(p.to, numbered(i, 10));
  }
  p.tx.send(p.to, numbered(501, 10));  // an ordinary send takes any deferred ones along
  ASSERT_TRUE(p.receiver.wait_for(502, 10s)) << p.receiver.count() << " arrived";
  EXPECT_EQ(p.receiver.error(), "");
  EXPECT_EQ(p.returns.size(), 0u);
}

TEST_P(ChannelNetTransport, LargePartsArriveIntact) {
  Pair p(GetParam());
  for (uint64_t i = 0; i < 4; ++i) p.tx.send(p.to, numbered(i, 1, (8 << 20) + i));
  ASSERT_TRUE(p.receiver.wait_for(4, 30s));
  EXPECT_EQ(p.receiver.error(), "");
}

TEST_P(ChannelNetTransport, SlowStreamIsAckedByTheTimer) {  // CH-3: acks arrive without ack_every
  // On virtual time (CK-2): without acks every envelope would expire after delivery_timeout;
  // the 2 ms ack timer keeps each far inside it. Sends are 20 ms of virtual time apart.
  auto clock = std::make_shared<base::ManualClock>();
  Config c = test_config();
  c.clock = clock;
  c.delivery_timeout = 1000ms;
  c.ack_every = 1'000'000;
  c.ack_delay = 2ms;
  Pair p(GetParam(), 1, c);
  bool wire = GetParam() != Kind::kInproc;  // inproc pipes ack as they drain, with no timer
  for (uint64_t i = 0; i < 40; ++i) {
    p.tx.send(p.to, numbered(i));
    ASSERT_TRUE(p.receiver.wait_for(i + 1, 10s)) << p.receiver.count() << " arrived";
    // Delivered, and nothing but the ack timer can acknowledge it: time stands still.
    if (wire) {
      EXPECT_EQ(p.tx.unacknowledged(p.to), 1u) << "acked before its ack timer ran";
    }
    clock->advance(20ms);
    // The ack timer ran inside advance(); its Ack crosses the socket on the io threads. Each
    // poll that does not see it yet moves time 1 ms on, in case the receiver armed the timer
    // only after the advance.
    ASSERT_TRUE(eventually(
        [&] {
          if (p.tx.unacknowledged(p.to) == 0) return true;
          clock->advance(1ms);
          return false;
        },
        10s))
        << "envelope " << i << " was not acknowledged";
  }
  clock->advance(1200ms);  // past every deadline: none may expire
  EXPECT_EQ(p.returns.size(), 0u);
  EXPECT_EQ(p.receiver.error(), "");
}

// Transports with a wire, whose receivers ack (inproc pipes ack as they drain).
class ChannelSocketTransport : public ChannelNetTransport {};

TEST_P(ChannelSocketTransport, ASendToThePeerAcksWhatItSent) {  // CH-10
  // The ack timer is far off, so only a send back can acknowledge before stop(): stop() hands
  // back exactly the envelopes not acknowledged (CH-3).
  Config c = test_config();
  c.ack_every = 1'000'000;
  c.ack_delay = 60s;
  c.ack_with_send_after = 0us;
  TempDir dir;
  Receiver a_got, b_got;
  Returns a_back, b_back;
  IoThreads a_io(1), b_io(1);
  Net a(a_io.io(), c, a_got.fn(), a_back.fn());
  Net b(b_io.io(), c, b_got.fn(), b_back.fn());
  auto a_addr = a.listen(GetParam() == Kind::kTcp ? listen_address(GetParam(), dir)
                                                  : *Address::parse("unix:" + dir.path("a.sock")));
  auto b_addr = b.listen(listen_address(GetParam(), dir));
  ASSERT_TRUE(a_addr && b_addr);
  for (uint64_t i = 0; i < 3; ++i) a.send(*b_addr, numbered(i));
  ASSERT_TRUE(b_got.wait_for(3, 10s));
  b.send(*a_addr, numbered(0));  // the reply: acks a's three on b's way out
  ASSERT_TRUE(a_got.wait_for(1, 10s));
  // a reads the Ack on its link's socket, apart from the reply: wait until it has.
  EXPECT_TRUE(eventually([&] { return a.unacknowledged(*b_addr) == 0; }, 10s))
      << "a's envelopes were not acknowledged by b's send";
  a.stop();
  b.stop();
  EXPECT_EQ(a_back.size(), 0u) << "a's envelopes were not acknowledged by b's send";
  EXPECT_EQ(b_back.size(), 1u) << "b's reply had nothing to ack it but the (60 s) timer";
  EXPECT_EQ(a_got.error(), "");
  EXPECT_EQ(b_got.error(), "");
}

TEST_P(ChannelNetTransport, SurvivesRandomResetsMidStream) {  // CH-1, CH-2
  // The stream goes out in batches, and each batch is cut once, by a reset of one side or the
  // other at a random point of its delivery. The resets are driven by the receiver's progress,
  // not by time, so that a fast machine cannot finish the stream before they happen.
  Pair p(GetParam());
  constexpr uint64_t kBatches = 40;
  constexpr uint64_t kPerBatch = 2500;
  constexpr uint64_t kCount = kBatches * kPerBatch;
  uint32_t r = 12345;
  for (uint64_t b = 0; b < kBatches; ++b) {
    for (uint64_t i = b * kPerBatch; i < (b + 1) * kPerBatch; ++i) {
      p.tx.send(p.to, numbered(i, 5000));
    }
    r = r * 1103515245 + 12345;
    const uint64_t cut_at = b * kPerBatch + 1 + (r >> 8) % (kPerBatch - 1);
    ASSERT_TRUE(eventually([&] { return p.receiver.count() >= cut_at; }, 60s))
        << "batch " << b << ": " << p.receiver.count() << " arrived, waiting for " << cut_at;
    (r & 0x10000 ? p.tx : p.rx).reset_connections_for_test();
  }
  ASSERT_TRUE(p.receiver.wait_for(kCount, 60s)) << p.receiver.count() << " arrived";
  // Once all is acknowledged nothing is resent; once the receiver has stopped, nothing more
  // is delivered: a late duplicate would have shown up as an order error or in the count.
  EXPECT_TRUE(eventually([&] { return p.tx.unacknowledged(p.to) == 0; }, 10s));
  p.rx.stop();
  EXPECT_EQ(p.receiver.count(), kCount);
  EXPECT_EQ(p.receiver.error(), "");
  EXPECT_EQ(p.returns.size(), 0u);
}

// CH-6: the 100 sends return while nobody listens (the listener is made after them, on this
// thread), and are delivered once it exists. The sender's timers are on virtual time, so
// that its failed dials are counted, not slept through.
TEST_P(ChannelNetTransport, SendBeforeTheListenerExistsIsDeliveredOnceItDoes) {
  TempDir dir;
  Receiver receiver;
  Returns returns;
  IoThreads io(2);
  Address to = listen_address(GetParam(), dir);
  if (to.transport == Transport::kTcp) to.port = free_tcp_port();
  auto clock = std::make_shared<base::ManualClock>();
  Config c = test_config();
  c.clock = clock;
  c.delivery_timeout = 3600s;  // virtual: the polls below cannot reach it
  Net tx(io.io(), c, receiver.fn(), returns.fn());
  for (uint64_t i = 0; i < 100; ++i) tx.send(to, numbered(i));
  // The delivery deadline, and once a dial has failed its retry: three failed dials.
  for (int dial = 0; dial < 3; ++dial) {
    ASSERT_TRUE(eventually([&] { return clock->pending() >= 2; }, 5s)) << "dial " << dial;
    clock->advance(c.reconnect_max);  // the retry runs: the next dial
  }
  Net rx(io.io(), test_config(), receiver.fn(), returns.fn());
  ASSERT_TRUE(rx.listen(to));
  // The link is backing off or dialling; until it connects, each poll moves the sender's
  // time on by a backoff.
  EXPECT_TRUE(eventually(
      [&] {
        if (receiver.count() >= 100) return true;
        if (receiver.count() == 0) clock->advance(c.reconnect_max);
        return false;
      },
      10s))
      << receiver.count();
  EXPECT_EQ(receiver.error(), "");
  EXPECT_EQ(returns.size(), 0u);
}

INSTANTIATE_TEST_SUITE_P(All, ChannelNetTransport,
                         ::testing::Values(Kind::kInproc, Kind::kUnix, Kind::kAbstract, Kind::kTcp),
                         kind_name);
INSTANTIATE_TEST_SUITE_P(Sockets, ChannelSocketTransport,
                         ::testing::Values(Kind::kUnix, Kind::kAbstract, Kind::kTcp), kind_name);

// An address where nobody listens, with the reason a dial there fails.
struct Nowhere {
  Address address;
  std::string why;
};

TEST(ChannelNet, DeliveryTimeoutHandsEachEnvelopeBackWithTheReason) {  // CH-3
  TempDir dir;
  // A socket file nobody listens on, as a crashed proc leaves.
  std::string stale = dir.path("stale.sock");
  {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::strcpy(sa.sun_path, stale.c_str());
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    ::close(fd);
  }
  uint16_t port = free_tcp_port();
  std::string inproc = unique_name("nobody");
  const Nowhere cases[] = {
      {*Address::parse("unix:" + dir.path("missing.sock")),
       "connect: No such file or directory"},
      {*Address::parse("unix:" + stale), "connect: Connection refused"},
      {*Address::parse("tcp:127.0.0.1:" + std::to_string(port)), "connect: Connection refused"},
      {*Address::parse("inproc:" + inproc), "no listener at inproc:" + inproc},
  };
  for (const Nowhere& c : cases) {
    Returns returns;
    IoThreads io(2);
    Config config = test_config();
    config.delivery_timeout = 150ms;
    Net net(io.io(), config, nullptr, returns.fn());
    auto start = std::chrono::steady_clock::now();
    for (uint64_t i = 0; i < 5; ++i) net.send(c.address, numbered(i));
    ASSERT_TRUE(returns.wait_for(5, 5s)) << c.address.to_string();
    EXPECT_GE(std::chrono::steady_clock::now() - start, 150ms);
    auto items = returns.take();
    for (uint64_t i = 0; i < items.size(); ++i) {
      EXPECT_EQ(items[i].first.order_seq, i);  // handed back in send order
      EXPECT_TRUE(items[i].second.is(ChannelErrc::kDeliveryTimeout));
      EXPECT_EQ(items[i].second.message,
                "no ack from " + c.address.to_string() + " within 150 ms: " + c.why);
    }
  }
}

TEST(ChannelNet, StopHandsBackWhatIsQueuedBeforeReturning) {  // CH-3
  TempDir dir;
  Returns returns;
  IoThreads io(2);
  Net net(io.io(), test_config(), nullptr, returns.fn());
  Address nowhere = *Address::parse("unix:" + dir.path("nobody.sock"));
  Address nobody_inproc = *Address::parse("inproc:" + unique_name("nobody"));
  for (uint64_t i = 0; i < 10; ++i) net.send(i % 2 ? nowhere : nobody_inproc, numbered(i));
  net.stop();
  auto items = returns.take();
  ASSERT_EQ(items.size(), 10u);
  for (auto& [env, err] : items) {
    EXPECT_TRUE(err.is(ChannelErrc::kCancelled)) << err.to_string();
    EXPECT_NE(err.message.find("net stopped"), std::string::npos);
  }
  net.send(nowhere, numbered(99));  // after stop: refused at once
  items = returns.take();
  ASSERT_EQ(items.size(), 1u);
  EXPECT_TRUE(items[0].second.is(ChannelErrc::kCancelled));
  net.stop();  // idempotent
}

TEST(ChannelNet, ForgetDropsThePeersLinkAndHandsBackWhatItHeld) {  // CH-11
  TempDir dir;
  Returns returns;
  IoThreads io(2);
  Net net(io.io(), test_config(), nullptr, returns.fn());
  Address gone = *Address::parse("unix:" + dir.path("gone.sock"));
  Address other = *Address::parse("unix:" + dir.path("other.sock"));
  for (uint64_t i = 0; i < 4; ++i) net.send(i % 2 ? gone : other, numbered(i));
  EXPECT_EQ(net.link_count(), 2u);
  net.forget(gone, "the proc at " + gone.to_string() + " has ended");
  EXPECT_EQ(net.link_count(), 1u);
  auto items = returns.take();  // on the calling thread, before forget() returns
  ASSERT_EQ(items.size(), 2u);
  for (auto& [env, err] : items) {
    EXPECT_EQ(env.order_seq % 2, 1u);  // only the forgotten peer's envelopes
    EXPECT_TRUE(err.is(ChannelErrc::kCancelled)) << err.to_string();
    EXPECT_EQ(err.message, "the proc at " + gone.to_string() + " has ended before " +
                               gone.to_string() + " acknowledged");
  }
  net.forget(gone, "again");  // no link: nothing to do
  net.forget(*Address::parse("unix:" + dir.path("never.sock")), "never sent to");
  EXPECT_EQ(net.link_count(), 1u);
  EXPECT_TRUE(returns.take().empty());
  net.send(gone, numbered(7));  // a new link, dialled afresh
  EXPECT_EQ(net.link_count(), 2u);
  net.stop();
  EXPECT_EQ(returns.take().size(), 3u);  // the other peer's two and the new one
}

TEST_P(ChannelNetTransport, ALinkForgottenWhileInUseDeliversAfresh) {  // CH-11
  Pair p(GetParam());
  for (uint64_t i = 0; i < 50; ++i) p.tx.send(p.to, numbered(i));
  ASSERT_TRUE(p.receiver.wait_for(50, 10s));
  p.tx.forget(p.to, "forgotten by the test");
  EXPECT_EQ(p.tx.link_count(), 0u);
  for (uint64_t i = 50; i < 100; ++i) p.tx.send(p.to, numbered(i));
  ASSERT_TRUE(p.receiver.wait_for(100, 10s));
  EXPECT_EQ(p.receiver.error(), "");  // 0..99, each once, in order
  EXPECT_EQ(p.tx.link_count(), 1u);
}

TEST(ChannelNet, RefusesAnEnvelopeOverTheFrameLimitAtOnce) {
  Returns returns;
  IoThreads io;
  Config c = test_config();
  c.max_frame_bytes = 4096;
  c.max_parts = 4;
  Net net(io.io(), c, nullptr, returns.fn());
  Address to = *Address::parse("inproc:" + unique_name("x"));
  net.send(to, numbered(0, 1, 5000));
  wire::Envelope many = numbered(1);
  many.parts.resize(5);
  net.send(to, std::move(many));
  auto items = returns.take();
  ASSERT_EQ(items.size(), 2u);
  EXPECT_TRUE(items[0].second.is(ChannelErrc::kFrameTooLarge));
  EXPECT_NE(items[0].second.message.find("exceeds max_frame_bytes 4096"), std::string::npos);
  EXPECT_TRUE(items[1].second.is(ChannelErrc::kFrameTooLarge));
  EXPECT_NE(items[1].second.message.find("has 5 parts, the limit is 4"), std::string::npos);
}

TEST(ChannelNet, InprocDeliversOnTheDestinationIoContext) {
  Returns returns;
  IoThreads rx_io(2), tx_io(1);
  std::atomic<int> wrong_thread{0};
  Net rx(
      rx_io.io(), test_config(),
      [&](wire::Envelope&&) { wrong_thread += !rx_io.runs_here(); }, returns.fn());
  Net tx(tx_io.io(), test_config(), nullptr, returns.fn());
  Address to = *rx.listen(*Address::parse("inproc:" + unique_name("rx")));
  Receiver order;
  Net rx2(rx_io.io(), test_config(), order.fn(), returns.fn());
  Address to2 = *rx2.listen(*Address::parse("inproc:" + unique_name("rx2")));
  for (uint64_t i = 0; i < 1000; ++i) {
    tx.send(to, numbered(i));
    tx.send(to2, numbered(i));
  }
  ASSERT_TRUE(order.wait_for(1000, 10s));
  EXPECT_EQ(order.error(), "");
  EXPECT_EQ(wrong_thread.load(), 0);
}

TEST(ChannelNet, InprocListenerStopHandsBackWhatItDidNotDeliver) {  // CH-3
  Returns returns, rx_returns;
  IoThreads tx_io;
  auto rx_io = std::make_unique<asio::io_context>();  // never run: nothing drains
  auto rx = std::make_unique<Net>(*rx_io, test_config(), [](wire::Envelope&&) {},
                                  rx_returns.fn());
  Address to = *rx->listen(*Address::parse("inproc:" + unique_name("rx")));
  Net tx(tx_io.io(), test_config(), nullptr, returns.fn());
  for (uint64_t i = 0; i < 10; ++i) tx.send(to, numbered(i));
  rx->stop();
  ASSERT_TRUE(returns.wait_for(10, 5s));
  auto items = returns.take();
  for (uint64_t i = 0; i < 10; ++i) {
    EXPECT_EQ(items[i].first.order_seq, i);
    EXPECT_TRUE(items[i].second.is(ChannelErrc::kCancelled));
    EXPECT_EQ(items[i].second.message, to.to_string() + " stopped before delivering");
  }
  rx.reset();
  rx_io.reset();
}

TEST(ChannelNet, StopWaitsForARunningDeliverFn) {
  TempDir dir;
  IoThreads io(2);
  std::atomic<bool> entered{false}, finished{false};
  std::atomic<int> after_stop{0};
  std::atomic<bool> stopped{false};
  Net rx(
      io.io(), test_config(),
      [&](wire::Envelope&&) {
        if (stopped) ++after_stop;
        if (!entered.exchange(true)) {
          std::this_thread::sleep_for(200ms);
          finished = true;
        }
      },
      nullptr);
  Address to = *rx.listen(*Address::parse("unix:" + dir.path("r.sock")));
  Returns returns;
  Net tx(io.io(), test_config(), nullptr, returns.fn());
  for (uint64_t i = 0; i < 100; ++i) tx.send(to, numbered(i));
  ASSERT_TRUE(eventually([&] { return entered.load(); }, 5s));
  rx.stop();
  stopped = true;
  EXPECT_TRUE(finished);
  // Whatever could still run has run once both Nets have stopped and the io threads are
  // joined.
  tx.stop();
  io.join();
  EXPECT_EQ(after_stop.load(), 0);
}

TEST(ChannelNet, StopFromInsideDeliverFnReturnsAndEndsDelivery) {
  TempDir dir;
  IoThreads io(2);
  std::atomic<int> calls{0};
  std::atomic<bool> stop_returned{false};
  std::unique_ptr<Net> rx;
  rx = std::make_unique<Net>(
      io.io(), test_config(),
      [&](wire::Envelope&&) {
        if (calls++ == 0) {
          rx->stop();  // must not wait for this very call
          stop_returned = true;
        }
      },
      nullptr);
  Address to = *rx->listen(*Address::parse("unix:" + dir.path("r.sock")));
  Returns returns;
  Net tx(io.io(), test_config(), nullptr, returns.fn());
  for (uint64_t i = 0; i < 100; ++i) tx.send(to, numbered(i));
  EXPECT_TRUE(eventually([&] { return stop_returned.load(); }, 5s));
  tx.stop();
  io.join();  // whatever could still run has run
  EXPECT_EQ(calls.load(), 1);
  rx.reset();
}

TEST(ChannelNet, UnixListenReplacesAStaleFileAndRefusesALiveOne) {
  TempDir dir;
  IoThreads io;
  std::string path = dir.path("sub/r.sock");  // "sub" does not exist yet
  {
    Net first(io.io(), test_config(), nullptr, nullptr);
    ASSERT_TRUE(first.listen(*Address::parse("unix:" + path)));
    struct stat st;
    ASSERT_EQ(::stat(dir.path("sub").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    Net second(io.io(), test_config(), nullptr, nullptr);
    auto r = second.listen(*Address::parse("unix:" + path));
    ASSERT_FALSE(r);
    EXPECT_TRUE(r.error().is(ChannelErrc::kListenFailed));
    EXPECT_NE(r.error().message.find("in use by a live listener"), std::string::npos);
  }
  // stop() removed the file; a file left by a crash (bound, nobody listening) is replaced.
  EXPECT_FALSE(std::filesystem::exists(path));
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strcpy(sa.sun_path, path.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ::close(fd);
  Net third(io.io(), test_config(), nullptr, nullptr);
  EXPECT_TRUE(third.listen(*Address::parse("unix:" + path)));
  third.stop();
  // Never a regular file.
  std::ofstream(dir.path("file")) << "data";
  Net fourth(io.io(), test_config(), nullptr, nullptr);
  auto r = fourth.listen(*Address::parse("unix:" + dir.path("file")));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("exists and is not a socket"), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(dir.path("file")));
}

// HA-2's reservation: the port is refused to anyone else while held, and the proc told
// reuse_port listens on it and is reached.
TEST(PortReservation, HoldsThePortForAReusePortListenerOnly) {
  auto r = PortReservation::make("127.0.0.1");
  ASSERT_TRUE(r) << r.error().to_string();
  ASSERT_NE(r->port(), 0);
  Address addr{Transport::kTcp, "127.0.0.1", r->port()};
  // Anyone else is refused the port while it is held ...
  IoThreads io(1);
  Receiver other_rx;
  Returns other_returns;
  Net other(io.io(), test_config(), other_rx.fn(), other_returns.fn());
  auto refused = other.listen(addr);
  EXPECT_FALSE(refused);
  // ... and the proc it was reserved for (Config::reuse_port) listens on it and is reached.
  Config c = test_config();
  c.reuse_port = true;
  Receiver receiver;
  Returns rx_returns, returns;
  Net rx(io.io(), c, receiver.fn(), rx_returns.fn());
  auto bound = rx.listen(addr);
  ASSERT_TRUE(bound) << bound.error().to_string();
  EXPECT_EQ(*bound, addr);
  IoThreads tx_io(1);
  Net tx(tx_io.io(), test_config(), [](wire::Envelope&&) {}, returns.fn());
  for (uint64_t i = 0; i < 100; ++i) tx.send(addr, numbered(i));
  EXPECT_TRUE(receiver.wait_for(100, 10s)) << receiver.count();
  EXPECT_EQ(receiver.error(), "");
  // Moving the reservation keeps it; destroying it frees the port.
  PortReservation moved = std::move(*r);
  EXPECT_EQ(moved.port(), addr.port);
}

TEST(PortReservation, ReportsAHostItCannotBind) {
  auto r = PortReservation::make("192.0.2.1");  // TEST-NET-1: not an address of this machine
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("192.0.2.1"), std::string::npos) << r.error().message;
}

TEST(ChannelNet, InprocNameIsExclusiveUntilStop) {
  IoThreads io;
  std::string name = "inproc:" + unique_name("x");
  auto a = std::make_unique<Net>(io.io(), test_config(), nullptr, nullptr);
  ASSERT_TRUE(a->listen(*Address::parse(name)));
  Net b(io.io(), test_config(), nullptr, nullptr);
  EXPECT_FALSE(b.listen(*Address::parse(name)));
  a.reset();
  EXPECT_TRUE(b.listen(*Address::parse(name)));
}

}  // namespace
}  // namespace podium::channel

namespace podium::channel {
namespace {

// CH-8: TCP connections authenticate with the shared secret before any frame.
struct AuthPair {
  AuthPair(std::string rx_secret, std::string tx_secret)
      : rx_io(1), tx_io(1),
        rx(rx_io.io(), with_secret(rx_secret), receiver.fn(), rx_returns.fn()),
        tx(tx_io.io(), with_secret(tx_secret),
           [](wire::Envelope&&) { ADD_FAILURE() << "tx got an envelope"; }, returns.fn()) {
    auto bound = rx.listen(*Address::parse("tcp:127.0.0.1:0"));
    EXPECT_TRUE(bound) << bound.error().to_string();
    if (bound) to = *bound;
  }
  static Config with_secret(std::string secret) {
    Config c = test_config();
    c.secret = std::move(secret);
    return c;
  }
  Receiver receiver;
  Returns rx_returns, returns;
  IoThreads rx_io, tx_io;
  Net rx, tx;
  Address to;
};

TEST(ChannelAuth, PeersWithTheSameSecretExchangeFrames) {
  AuthPair p("job-secret-1", "job-secret-1");
  for (uint64_t i = 0; i < 2000; ++i) p.tx.send(p.to, numbered(i, 500));
  ASSERT_TRUE(p.receiver.wait_for(2000, 30s)) << p.receiver.count() << " arrived";
  EXPECT_EQ(p.receiver.error(), "");
  EXPECT_EQ(p.returns.size(), 0u);
}

TEST(ChannelAuth, AWrongSecretIsRefusedAtOnceAndTheListenerServesOthers) {
  AuthPair p("job-secret-1", "not-the-secret");
  auto t0 = std::chrono::steady_clock::now();
  p.tx.send(p.to, numbered(0));
  ASSERT_TRUE(p.returns.wait_for(1, 10s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);  // refused, not timed out (30 s)
  auto back = p.returns.take();
  EXPECT_TRUE(back[0].second.is(ChannelErrc::kAuthFailed)) << back[0].second.to_string();
  EXPECT_NE(back[0].second.message.find("refused our secret"), std::string::npos)
      << back[0].second.message;
  EXPECT_EQ(p.receiver.count(), 0u);  // nothing was decoded from the stranger
  // The listener keeps serving a peer that knows the secret.
  Returns good_returns;
  IoThreads good_io(1);
  Net good(good_io.io(), AuthPair::with_secret("job-secret-1"),
           [](wire::Envelope&&) {}, good_returns.fn());
  good.send(p.to, numbered(0));
  EXPECT_TRUE(p.receiver.wait_for(1, 10s));
  EXPECT_EQ(good_returns.size(), 0u);
}

TEST(ChannelAuth, ADiallerWithoutASecretLearnsThatOneIsNeeded) {
  AuthPair p("job-secret-1", "");
  p.tx.send(p.to, numbered(0));
  ASSERT_TRUE(p.returns.wait_for(1, 10s));
  auto back = p.returns.take();
  EXPECT_TRUE(back[0].second.is(ChannelErrc::kAuthFailed)) << back[0].second.to_string();
  EXPECT_NE(back[0].second.message.find("PODIUM_SECRET"), std::string::npos);
  EXPECT_EQ(p.receiver.count(), 0u);
}

TEST(ChannelAuth, AListenerWithoutTheSecretIsNotTrusted) {
  // The dialler holds a secret, the listener (an impostor) does not: the dialler waits for
  // a challenge that never comes and sends nothing but... nothing: no Hello, no frame.
  Config c = test_config();
  c.delivery_timeout = 500ms;
  IoThreads rx_io(1), tx_io(1);
  Receiver receiver;
  Returns rx_returns, returns;
  Net rx(rx_io.io(), test_config(), receiver.fn(), rx_returns.fn());
  c.secret = "job-secret-1";
  Net tx(tx_io.io(), c, [](wire::Envelope&&) {}, returns.fn());
  auto bound = rx.listen(*Address::parse("tcp:127.0.0.1:0"));
  ASSERT_TRUE(bound);
  tx.send(*bound, numbered(0));
  ASSERT_TRUE(returns.wait_for(1, 10s));  // handed back at the delivery timeout
  EXPECT_EQ(receiver.count(), 0u);
}

}  // namespace
}  // namespace podium::channel
