// The channel's timers on virtual time (Config::clock = base::ManualClock): deadlines that
// pass in advance(), with no wall-clock wait for them.
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include "podium/base/clock.h"
#include "podium/channel/net.h"
#include "podium/channel/test_util.h"

namespace podium::channel::testing {
namespace {

// True when the peer has closed `fd` already (no wait).
bool closed_now(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char buf[256];
  return ::recv(fd, buf, sizeof buf, MSG_DONTWAIT) == 0;
}

// CH-3 on virtual time (CK-2): an envelope for nobody comes back exactly when the clock
// passes delivery_timeout, inside the advance() that passes it.
TEST(ChannelVirtualTime, DeliveryTimeoutHandsBackOnAdvance) {
  TempDir dir;
  auto clock = std::make_shared<base::ManualClock>();
  Returns returns;
  IoThreads io(1);
  Config config = test_config();
  config.clock = clock;
  config.delivery_timeout = 30s;
  Net net(io.io(), config, nullptr, returns.fn());
  auto nowhere = *Address::parse("unix:" + dir.path("missing.sock"));
  for (uint64_t i = 0; i < 3; ++i) net.send(nowhere, numbered(i));
  // The dial fails on the io thread, which then arms the backoff beside the deadline.
  ASSERT_TRUE(eventually([&] { return clock->pending() >= 2; }, 5s));
  clock->advance(30s - 1ms);
  EXPECT_EQ(returns.size(), 0u) << "handed back before its deadline";
  clock->advance(1ms);
  ASSERT_EQ(returns.size(), 3u) << "the deadline passed inside advance()";
  auto items = returns.take();
  for (uint64_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(items[i].first.order_seq, i);
    EXPECT_TRUE(items[i].second.is(ChannelErrc::kDeliveryTimeout));
    EXPECT_EQ(items[i].second.message, "no ack from " + nowhere.to_string() +
                                           " within 30000 ms: connect: No such file or directory");
  }
  net.stop();
}

// CH-13 on virtual time: a connection that says nothing is closed when the clock passes
// handshake_timeout, and not before.
TEST(ChannelVirtualTime, HandshakeDeadlineClosesOnAdvance) {
  TempDir dir;
  auto clock = std::make_shared<base::ManualClock>();
  Receiver receiver;
  Returns returns;
  IoThreads io(1);
  Config config = test_config();
  config.clock = clock;
  config.handshake_timeout = 10s;
  Net rx(io.io(), config, receiver.fn(), returns.fn());
  auto to = rx.listen(*Address::parse("unix:" + dir.path("rx")));
  ASSERT_TRUE(to) << to.error().to_string();
  int fd = dial(*to);
  ASSERT_GE(fd, 0);
  // Accepted once its deadline is armed.
  ASSERT_TRUE(eventually([&] { return clock->pending() >= 1; }, 5s));
  clock->advance(10s - 1ms);
  EXPECT_FALSE(closed_now(fd)) << "closed before its deadline";
  EXPECT_EQ(rx.stats().handshake_timeouts, 0u);
  clock->advance(1ms);
  EXPECT_EQ(rx.stats().handshake_timeouts, 1u);
  EXPECT_TRUE(closed_by_peer(fd, 5s));
  ::close(fd);
  rx.stop();
}

}  // namespace
}  // namespace podium::channel::testing
