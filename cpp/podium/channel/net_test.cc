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
  Config c = test_config();
  c.delivery_timeout = 300ms;
  c.ack_every = 1'000'000;
  c.ack_delay = 2ms;
  Pair p(GetParam(), 1, c);
  for (uint64_t i = 0; i < 40; ++i) {
    p.tx.send(p.to, numbered(i));
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(p.receiver.wait_for(40, 10s));
  std::this_thread::sleep_for(400ms);  // past every deadline: none may expire
  EXPECT_EQ(p.returns.size(), 0u);
  EXPECT_EQ(p.receiver.error(), "");
}

TEST_P(ChannelNetTransport, SurvivesRandomResetsMidStream) {  // CH-1, CH-2
  Pair p(GetParam());
  constexpr uint64_t kCount = 100000;
  std::atomic<bool> done{false};
  std::atomic<int> resets{0};
  std::thread resetter([&] {
    uint32_t r = 12345;
    while (!done.load()) {
      // A random moment, after some progress since the last reset (see ChannelFault).
      for (uint64_t seen = p.receiver.count(); !done && p.receiver.count() == seen;) {
        std::this_thread::sleep_for(100us);
      }
      r = r * 1103515245 + 12345;
      std::this_thread::sleep_for(std::chrono::microseconds(r % 3000));
      (r & 0x10000 ? p.tx : p.rx).reset_connections_for_test();
      ++resets;
    }
  });
  for (uint64_t i = 0; i < kCount; ++i) p.tx.send(p.to, numbered(i, 5000));
  bool all = p.receiver.wait_for(kCount, 60s);
  done = true;
  resetter.join();
  ASSERT_TRUE(all) << p.receiver.count() << " arrived";
  std::this_thread::sleep_for(50ms);  // a late duplicate would show up as an order error
  EXPECT_EQ(p.receiver.count(), kCount);
  EXPECT_EQ(p.receiver.error(), "");
  EXPECT_EQ(p.returns.size(), 0u);
  EXPECT_GT(resets.load(), 10);
}

TEST_P(ChannelNetTransport, SendBeforeTheListenerExistsIsDeliveredOnceItDoes) {
  TempDir dir;
  Receiver receiver;
  Returns returns;
  IoThreads io(2);
  Address to = listen_address(GetParam(), dir);
  if (to.transport == Transport::kTcp) to.port = free_tcp_port();
  Net tx(io.io(), test_config(), receiver.fn(), returns.fn());
  for (uint64_t i = 0; i < 100; ++i) tx.send(to, numbered(i));
  std::this_thread::sleep_for(50ms);  // several failed dials
  Net rx(io.io(), test_config(), receiver.fn(), returns.fn());
  ASSERT_TRUE(rx.listen(to));
  EXPECT_TRUE(receiver.wait_for(100, 10s)) << receiver.count();
  EXPECT_EQ(receiver.error(), "");
}

INSTANTIATE_TEST_SUITE_P(All, ChannelNetTransport,
                         ::testing::Values(Kind::kInproc, Kind::kUnix, Kind::kAbstract, Kind::kTcp),
                         kind_name);

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
  for (int i = 0; i < 5000 && !entered; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(entered);
  rx.stop();
  stopped = true;
  EXPECT_TRUE(finished);
  std::this_thread::sleep_for(50ms);
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
  for (int i = 0; i < 5000 && !stop_returned; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(stop_returned);
  std::this_thread::sleep_for(50ms);
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
