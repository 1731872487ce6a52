// Gateways (GW-1..GW-4, net.h): a client that listens nowhere reaches a peer through a
// gateway Net, and the peer's answers come back over the duplex the client dialled.
#include <gtest/gtest.h>

#include <future>

#include "podium/channel/test_certs.h"
#include "podium/channel/test_util.h"
#include "podium/wire/message.h"

namespace podium::channel {
namespace {

using namespace testing;

// A gateway G and a peer P listening on loopback TCP, and a client C attached through G.
struct Attached {
  // What the client's via_event writes: declared first, so that it outlives the Nets.
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Address> routed;
  int openings = 0;
  std::string last_error;

  explicit Attached(std::string secret = "gw-secret", bool tls = false)
      : g(g_io.io(), with(secret, tls ? ca().issue("g") : TlsConfig{}), [](wire::Envelope&&) {},
          g_returns.fn()),
        p(p_io.io(), with(secret, tls ? ca().issue("p") : TlsConfig{}), p_rx.fn(),
          p_returns.fn()) {
    auto gb = g.listen(*Address::parse("tcp:127.0.0.1:0"));
    auto pb = p.listen(*Address::parse("tcp:127.0.0.1:0"));
    EXPECT_TRUE(gb && pb);
    if (!gb || !pb) return;
    gateway = *gb;
    peer = *pb;
    g.serve_as_gateway(gateway);
    Config cc = with(secret, tls ? ca().issue("c") : TlsConfig{});
    cc.via = gateway;
    c = std::make_unique<Net>(c_io.io(), cc, c_rx.fn(), c_returns.fn());
  }
  static Config with(std::string secret, TlsConfig tls = {}) {
    Config c = test_config();
    c.secret = std::move(secret);
    c.tls = std::move(tls);
    return c;
  }
  static const TestCa& ca() {
    static const TestCa ca("gateway-test-ca");
    return ca;
  }
  // Starts the duplex; the routed address, or nullopt after `limit`.
  std::optional<Address> start(std::chrono::milliseconds limit = 10s) {
    c->start_via([this](Result<Address> e) {
      std::lock_guard lock(mu);
      if (e) {
        routed = *e;
        ++openings;
      } else {
        last_error = e.error().message;
      }
      cv.notify_all();
    });
    std::unique_lock lock(mu);
    cv.wait_for(lock, limit, [&] { return routed.has_value(); });
    return routed;
  }
  int openings_now() {
    std::lock_guard lock(mu);
    return openings;
  }

  Receiver p_rx, c_rx;
  Returns g_returns, p_returns, c_returns;
  IoThreads g_io, p_io, c_io;
  Net g, p;
  std::unique_ptr<Net> c;
  Address gateway, peer;
};

TEST(ChannelGateway, AClientReachesAPeerAndIsAnsweredOverItsDuplex) {  // GW-1, GW-2, GW-3
  Attached a;
  auto routed = a.start();
  ASSERT_TRUE(routed) << a.last_error;
  // The client is known by the gateway's address with an incarnation of its own.
  EXPECT_EQ(routed->target, a.gateway.target);
  EXPECT_EQ(routed->port, a.gateway.port);
  EXPECT_NE(routed->incarnation, 0u);
  for (uint64_t i = 0; i < 500; ++i) a.c->send(a.peer, numbered(i, 97));
  ASSERT_TRUE(a.p_rx.wait_for(500, 30s)) << a.p_rx.count();
  EXPECT_EQ(a.p_rx.error(), "");
  // One link, to the gateway, carried them all (GW-3); the peer got them unwrapped.
  EXPECT_EQ(a.c->link_count(), 1u);
  EXPECT_EQ(a.c->unacknowledged(a.peer), 0u);
  for (uint64_t i = 0; i < 500; ++i) a.p.send(*routed, numbered(i, 97));
  ASSERT_TRUE(a.c_rx.wait_for(500, 30s)) << a.c_rx.count();
  EXPECT_EQ(a.c_rx.error(), "");
  EXPECT_EQ(a.c_returns.size() + a.p_returns.size() + a.g_returns.size(), 0u);
}

TEST(ChannelGateway, TheDuplexAndTheForwardsRunInsideTls) {  // GW-1, GW-4, CH-9
  Attached a("gw-secret", /*tls=*/true);
  auto routed = a.start();
  ASSERT_TRUE(routed) << a.last_error;
  for (uint64_t i = 0; i < 300; ++i) {
    a.c->send(a.peer, numbered(i, 50));
    a.p.send(*routed, numbered(i, 50));
  }
  ASSERT_TRUE(a.p_rx.wait_for(300, 30s)) << a.p_rx.count();
  ASSERT_TRUE(a.c_rx.wait_for(300, 30s)) << a.c_rx.count();
  EXPECT_EQ(a.p_rx.error(), "");
  EXPECT_EQ(a.c_rx.error(), "");
  // A client without a certificate of the job's CA gets no duplex.
  IoThreads io;
  std::mutex mu;
  std::condition_variable cv;
  std::string error;
  Config cc = Attached::with("gw-secret");  // plaintext
  cc.via = a.gateway;
  Net stranger(io.io(), cc, [](wire::Envelope&&) {}, [](wire::Envelope&&, Error) {});
  stranger.start_via([&](Result<Address> e) {
    std::lock_guard lock(mu);
    if (!e) error = e.error().message;
    cv.notify_all();
  });
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return !error.empty(); }));
    EXPECT_NE(error.find("TLS"), std::string::npos) << error;
  }
  stranger.stop();
}

TEST(ChannelGateway, BrokenConnectionsResumeWithNothingLostOrRepeated) {  // GW-2, CH-1, CH-2
  Attached a;
  auto routed = a.start();
  ASSERT_TRUE(routed) << a.last_error;
  constexpr uint64_t kN = 3000;
  uint64_t sent = 0;
  for (uint64_t round = 1; round <= 3; ++round) {
    // Every connection is up (a reset during a secret exchange is a refusal, CH-8, and hands
    // the queue back): then every socket of the gateway goes, the duplex with them, while
    // more is sent; the client re-dials, keeps its routed address, and the sessions resume.
    ASSERT_TRUE(a.p_rx.wait_for(sent, 30s) && a.c_rx.wait_for(sent, 30s));
    if (round > 1) a.g.reset_connections_for_test();
    for (; sent < round * kN / 3; ++sent) {
      a.c->send(a.peer, numbered(sent));
      a.p.send(*routed, numbered(sent));
    }
  }
  ASSERT_TRUE(a.p_rx.wait_for(kN, 60s)) << a.p_rx.count();
  ASSERT_TRUE(a.c_rx.wait_for(kN, 60s)) << a.c_rx.count();
  EXPECT_EQ(a.p_rx.error(), "");
  EXPECT_EQ(a.c_rx.error(), "");
  EXPECT_GE(a.openings_now(), 2);
  std::lock_guard lock(a.mu);
  EXPECT_EQ(*a.routed, *routed);  // the same identity after the re-dial
}

TEST(ChannelGateway, ANetThatIsNoGatewayRefusesADuplex) {  // GW-4
  Attached a;
  std::mutex mu;
  std::condition_variable cv;
  std::string error;
  bool routed = false;
  Returns returns;
  IoThreads io;
  Config cc = Attached::with("gw-secret");
  cc.via = a.peer;  // a plain Net, not a gateway
  Net c(io.io(), cc, [](wire::Envelope&&) {}, returns.fn());
  c.start_via([&](Result<Address> e) {
    std::lock_guard lock(mu);
    if (e) routed = true; else error = e.error().message;
    cv.notify_all();
  });
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return !error.empty(); }));
    EXPECT_FALSE(routed);
    EXPECT_NE(error.find("duplex"), std::string::npos) << error;
  }
  c.stop();
}

TEST(ChannelGateway, ADuplexMayClaimOnlyAnAddressOfItsGateway) {  // GW-4
  Attached a("");  // no secret: the raw socket below speaks frames at once
  int fd = dial(a.gateway);
  ASSERT_GE(fd, 0);
  std::vector<std::byte> hello;
  wire::encode(wire::Hello{wire::kSessionProtocolVersion, 0, "tcp:10.9.9.9:1/abc", "",
                           wire::kHelloReverse}, hello);
  write_all(fd, hello);
  // The gateway closes it: no Hello of a link to that address comes back.
  pollfd pfd{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 10000), 1);
  char buf[64];
  EXPECT_EQ(::recv(fd, buf, sizeof buf, 0), 0);
  ::close(fd);
  EXPECT_GE(a.g.stats().refused_auth, 1u);
}

TEST(ChannelGateway, AGatewayForwardsToTcpAddressesOnly) {  // GW-4
  Attached a("");
  int fd = dial(a.gateway);
  ASSERT_GE(fd, 0);
  std::vector<std::byte> hello;
  wire::encode(wire::Hello{wire::kSessionProtocolVersion, 9, "tcp:10.9.9.9:1",
                           "unix:/tmp/another-jobs-proc.sock", 0}, hello);
  write_all(fd, hello);
  pollfd pfd{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 10000), 1);
  char buf[64];
  EXPECT_EQ(::recv(fd, buf, sizeof buf, 0), 0);  // closed, no HelloAck
  ::close(fd);
  EXPECT_GE(a.g.stats().refused_auth, 1u);
  // An envelope wrapped for a Unix socket is handed back by the gateway, not sent.
  IoThreads io;
  Net sender(io.io(), Attached::with(""), [](wire::Envelope&&) {}, [](wire::Envelope&&, Error) {});
  wire::Envelope e = numbered(0);
  e.headers.emplace_back("podium.via.to", "unix:/tmp/another-jobs-proc.sock");
  sender.send(a.gateway, std::move(e));
  ASSERT_TRUE(a.g_returns.wait_for(1, 10s));
  auto back = a.g_returns.take();
  EXPECT_NE(back[0].second.message.find("TCP addresses only"), std::string::npos)
      << back[0].second.message;
  EXPECT_TRUE(back[0].first.headers.empty());  // handed back without its wrapper
  sender.stop();
}

TEST(ChannelGateway, WhatWaitsForAnAbsentClientExpiresWithTheReason) {  // GW-2, CH-3
  Config gc = Attached::with("gw-secret");
  gc.delivery_timeout = 300ms;
  Receiver none;
  Returns g_returns, p_returns;
  IoThreads g_io, p_io;
  Net g(g_io.io(), gc, [](wire::Envelope&&) {}, g_returns.fn());
  auto gb = g.listen(*Address::parse("tcp:127.0.0.1:0"));
  ASSERT_TRUE(gb);
  g.serve_as_gateway(*gb);
  // A client attaches, then goes; a proc's envelope for it waits at the gateway and expires.
  Address routed;
  {
    std::promise<Address> got;
    std::once_flag once;
    IoThreads c_io;
    Config cc = Attached::with("gw-secret");
    cc.via = *gb;
    Net c(c_io.io(), cc, none.fn(), [](wire::Envelope&&, Error) {});
    c.start_via([&](Result<Address> e) {
      if (e) std::call_once(once, [&] { got.set_value(*e); });
    });
    auto f = got.get_future();
    ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
    routed = f.get();
    c.stop();
  }
  Net p(p_io.io(), gc, [](wire::Envelope&&) {}, p_returns.fn());
  ASSERT_TRUE(p.listen(*Address::parse("tcp:127.0.0.1:0")));
  p.send(routed, numbered(0));
  ASSERT_TRUE(g_returns.wait_for(1, 10s));
  auto back = g_returns.take();
  EXPECT_TRUE(back[0].second.is(ChannelErrc::kDeliveryTimeout)) << back[0].second.to_string();
  EXPECT_NE(back[0].second.message.find(routed.to_string()), std::string::npos)
      << back[0].second.message;
}

}  // namespace
}  // namespace podium::channel
