// Lent parts on Unix-socket links (CH-25, CH-26, WI-8): the receiver pulls large parts from
// the sender's memory instead of reading them from the socket.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>

#include "podium/channel/net.h"
#include "podium/channel/pull.h"
#include "podium/channel/warm_blocks.h"
#include "podium/channel/test_util.h"
#include "podium/wire/message.h"

namespace podium::channel {
namespace {

using namespace std::chrono_literals;
using namespace testing;

Config lend_config() {
  Config c = test_config();
  c.lend_min_bytes = 64 * 1024;
  return c;
}

// Every envelope: part 0 is its number; the even ones carry a 300 KB part (lent) and the
// odd ones a 20 KB part (inline), each filled with a byte of its number.
wire::Envelope with_parts(uint64_t i) {
  wire::Envelope e;
  e.kind = 1;
  e.dest = "proc[1].actor[0]";
  e.sender = "proc[0].actor[0]";
  e.order_seq = i;
  std::string n(16, '\0');
  std::memcpy(n.data(), &i, sizeof i);
  e.parts.push_back(Buffer::from_string(std::move(n)));
  e.parts.push_back(Buffer::from_string(std::string(i % 2 == 0 ? 300000 : 20000, char('a' + i % 26))));
  return e;
}

// What a receiver saw: in order, intact, and whether each large part arrived as memory of
// its own (BU-1).
struct Seen {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t next = 0;
  std::string error;
  size_t sole = 0;
  DeliverFn fn() {
    return [this](wire::Envelope&& e) {
      std::lock_guard lock(mu);
      uint64_t carried = ~uint64_t(0);
      if (e.parts.size() == 2 && e.parts[0].size() == 16) {
        std::memcpy(&carried, e.parts[0].data(), sizeof carried);
      }
      if (error.empty() && (e.order_seq != next || carried != next)) {
        error = "expected " + std::to_string(next) + ", got " + std::to_string(e.order_seq);
      }
      const Buffer& big = e.parts.at(1);
      if (error.empty() && big.size() != (next % 2 == 0 ? 300000u : 20000u)) error = "size";
      for (size_t k = 0; k < big.size() && error.empty(); k += 997) {
        if (big.view()[k] != char('a' + next % 26)) error = "damaged part";
      }
      if (big.sole_writer()) ++sole;
      ++next;
      cv.notify_all();
    };
  }
  bool wait_for(uint64_t n) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, 20s, [&] { return next >= n; });
  }
};

class ChannelLend : public ::testing::TestWithParam<bool> {};  // abstract socket or file

Address unix_address(bool abstract, const TempDir& dir) {
  return *Address::parse(abstract ? "unix:@" + unique_name("lend") : "unix:" + dir.path("r.sock"));
}

TEST_P(ChannelLend, LargePartsArePulledSmallOnesInlineInOrder) {  // CH-25, CH-26, WI-8
  TempDir dir;
  Seen seen;
  Returns returns;
  IoThreads rx_io(2), tx_io(2);
  Net rx(rx_io.io(), lend_config(), seen.fn(), nullptr);
  Net tx(tx_io.io(), lend_config(), nullptr, returns.fn());
  auto to = rx.listen(unix_address(GetParam(), dir));
  ASSERT_TRUE(to) << to.error().to_string();
  uint64_t pulls = rx.stats().pulls;
  // The first goes inline (it streams behind the Hello, before the HelloAck says the peer
  // pulls); once it is acknowledged, the HelloAck has been read.
  tx.send(*to, with_parts(0));
  ASSERT_TRUE(seen.wait_for(1));
  ASSERT_TRUE(eventually([&] { return tx.unacknowledged(*to) == 0; }, 10s));
  for (uint64_t i = 1; i < 40; ++i) tx.send(*to, with_parts(i));
  ASSERT_TRUE(seen.wait_for(40));
  EXPECT_EQ(seen.error, "");
  EXPECT_EQ(rx.stats().pulls - pulls, 19u);  // 2, 4, ..., 38
  EXPECT_EQ(seen.sole, 40u);  // pulled or read, each part is the receiver's own memory
  // CH-26: each pulled envelope is acked at once, which empties the lend table.
  EXPECT_TRUE(eventually([&] { return tx.stats().lent_parts == 0; }, 10s));
  EXPECT_EQ(returns.size(), 0u);
}

TEST_P(ChannelLend, AReceiverThatDoesNotPullGetsEveryPartInline) {  // CH-25
  TempDir dir;
  Seen seen;
  IoThreads rx_io(2), tx_io(2);
  Config rx_config = lend_config();
  rx_config.pull_lent = false;
  Returns returns;
  Net rx(rx_io.io(), rx_config, seen.fn(), nullptr);
  Net tx(tx_io.io(), lend_config(), nullptr, returns.fn());
  auto to = rx.listen(unix_address(GetParam(), dir));
  ASSERT_TRUE(to) << to.error().to_string();
  uint64_t pulls = rx.stats().pulls;
  tx.send(*to, with_parts(0));
  ASSERT_TRUE(seen.wait_for(1));
  ASSERT_TRUE(eventually([&] { return tx.unacknowledged(*to) == 0; }, 10s));
  for (uint64_t i = 1; i < 20; ++i) tx.send(*to, with_parts(i));
  ASSERT_TRUE(seen.wait_for(20));
  EXPECT_EQ(seen.error, "");
  EXPECT_EQ(rx.stats().pulls, pulls);
  EXPECT_EQ(tx.stats().lent_parts, 0u);
}

INSTANTIATE_TEST_SUITE_P(Unix, ChannelLend, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Abstract" : "File"; });

// A receiver whose DeliverFn blocks: the envelope it is delivering was pulled but not acked.
struct Blocking {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  size_t entered = 0;
  DeliverFn fn() {
    return [this](wire::Envelope&& e) {
      if (e.order_seq < 2) return;
      std::unique_lock lock(mu);
      ++entered;
      cv.notify_all();
      cv.wait_for(lock, 20s, [&] { return release; });
    };
  }
  void open() {
    std::lock_guard lock(mu);
    release = true;
    cv.notify_all();
  }
  bool wait_entered() {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, 20s, [&] { return entered > 0; });
  }
};

// Pulls `src` from this very process (CMA allows it), as a receiver pulls a lent part.
Buffer pull_own(const std::vector<char>& src) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int err = -1;
  std::vector<Buffer> got;
  wire::LentPart part{0, reinterpret_cast<uint64_t>(src.data()), src.size()};
  internal::pull_async(::getpid(), {part}, std::make_shared<std::atomic<bool>>(false),
                       [&](int e, std::vector<Buffer> parts) {
                         std::lock_guard lock(mu);
                         err = e;
                         got = std::move(parts);
                         done = true;
                         cv.notify_all();
                       });
  std::unique_lock lock(mu);
  cv.wait_for(lock, 20s, [&] { return done; });
  if (!done || err != 0 || got.size() != 1) return Buffer();
  return std::move(got[0]);
}

TEST(WarmBlocks, TheBlockOfAReleasedPartServesTheNextPullOfItsSizeAndIsFilledAnew) {  // CH-27
  if (internal::warm_limit() < 2 * internal::kWarmMinBytes) GTEST_SKIP() << "no warm blocks here";
  std::vector<char> src(internal::kWarmMinBytes + 12345, 'x');
  auto before = internal::warm_counts();
  Buffer first = pull_own(src);
  ASSERT_EQ(first.size(), src.size());
  EXPECT_EQ(std::memcmp(first.data(), src.data(), src.size()), 0);
  const std::byte* where = first.data();
  first = Buffer();  // the receiver is done with it: its block is kept
  EXPECT_EQ(internal::warm_counts().kept, before.kept + 1);
  std::memset(src.data(), 'y', src.size());
  Buffer second = pull_own(src);
  ASSERT_EQ(second.size(), src.size());
  EXPECT_EQ(second.data(), where) << "the kept block, its pages mapped already";
  EXPECT_EQ(internal::warm_counts().reused, before.reused + 1);
  EXPECT_EQ(std::memcmp(second.data(), src.data(), src.size()), 0) << "filled anew, whole";
  // Another size gets its own block; a small part is never kept.
  std::vector<char> other(internal::kWarmMinBytes + 1, 'z');
  Buffer third = pull_own(other);
  EXPECT_NE(third.data(), where);
  second = Buffer();
  third = Buffer();
  std::vector<char> small(1 << 20, 's');
  Buffer tiny = pull_own(small);
  tiny = Buffer();
  EXPECT_EQ(internal::warm_counts().kept, before.kept + 2);
  // Unused for kWarmIdle, they are let go (the pullers sweep once a second when idle).
  EXPECT_TRUE(eventually([&] { return internal::warm_counts().kept == 0; }, 10s));
}

TEST(WarmBlocks, ATakeSaysWhetherItsBlockIsAKeptOne) {  // CH-27
  if (internal::warm_limit() < 2 * internal::kWarmMinBytes) GTEST_SKIP() << "no warm blocks here";
  size_t len = internal::kWarmMinBytes + 4096 * 3;  // a size no other test keeps
  bool warm = true;
  void* p = internal::take_warm(len, 4096, &warm);
  ASSERT_NE(p, nullptr);
  EXPECT_FALSE(warm) << "a new block";
  internal::give_warm(p, len);
  void* q = internal::take_warm(len, 4096, &warm);
  EXPECT_EQ(q, p);
  EXPECT_TRUE(warm) << "the kept block";
  internal::give_warm(q, len);
}

TEST(ChannelLendLifetime, AnUnackedLentPartGoesWithItsConnection) {  // CH-26
  TempDir dir;
  Blocking rx_fn;
  Returns returns;
  IoThreads rx_io(2), tx_io(2);
  Net rx(rx_io.io(), lend_config(), rx_fn.fn(), nullptr);
  Net tx(tx_io.io(), lend_config(), nullptr, returns.fn());
  auto to = rx.listen(*Address::parse("unix:" + dir.path("r.sock")));
  ASSERT_TRUE(to);
  // The first is delivered and acked (so the HelloAck was read); the second's delivery
  // blocks the connection's read chain, so the third, lent, is on the wire unacknowledged.
  tx.send(*to, with_parts(1));
  ASSERT_TRUE(eventually([&] { return tx.unacknowledged(*to) == 0; }, 10s));
  tx.send(*to, with_parts(3));
  ASSERT_TRUE(rx_fn.wait_entered());
  tx.send(*to, with_parts(2));
  EXPECT_TRUE(eventually([&] { return tx.stats().lent_parts == 1; }, 10s));
  // Link death: the lend table empties and the envelope goes back to the sender.
  tx.forget(*to, "the peer has ended");
  EXPECT_EQ(tx.stats().lent_parts, 0u);
  EXPECT_EQ(returns.size(), 2u);
  rx_fn.open();
}

// A raw client: its Hello offers lending with a probe of this process's memory.
struct RawLender {
  int fd = -1;
  uint64_t probe = 0x5eed5eed5eed5eedull;
  ~RawLender() {
    if (fd >= 0) ::close(fd);
  }
  void hello(const Address& to, uint64_t probe_value) {
    fd = dial(to);
    ASSERT_GE(fd, 0);
    wire::Hello h;
    h.session_id = 77;
    h.flags = wire::kHelloLend;
    h.probe_addr = reinterpret_cast<uintptr_t>(&probe);
    h.probe_value = probe_value;
    std::vector<std::byte> b;
    wire::encode(h, b);
    write_all(fd, b);
  }
  // The HelloAck's flags.
  uint32_t hello_ack() {
    wire::FrameDecoder dec(wire::FrameLimits{.max_frame_bytes = 4096, .max_parts = 0}, 4096);
    std::byte buf[256];
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 10000) != 1) return 99;
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) return 98;
      std::optional<uint32_t> flags;
      auto s = dec.feed({buf, size_t(n)}, [&](wire::RawFrame&& f) {
        auto m = wire::decode(std::move(f));
        if (m && std::holds_alternative<wire::HelloAck>(*m)) {
          flags = std::get<wire::HelloAck>(*m).flags;
        }
      });
      if (!s) return 97;
      if (flags) return *flags;
    }
  }
  // A Data frame whose one part is lent from `addr`.
  void lend(uint64_t addr, uint64_t len) {
    wire::Envelope e;
    e.dest = "d";
    e.sender = "s";
    e.parts.push_back(Buffer(nullptr, reinterpret_cast<const std::byte*>(addr), len));
    std::vector<std::byte> b;
    wire::encode_data(1, e, b, 1);  // lends every part
    write_all(fd, b);
  }
};

TEST(ChannelLendRefusal, AWrongProbeGetsNoPullAndALentPartIsThenAProtocolError) {  // CH-25
  TempDir dir;
  Seen seen;
  IoThreads rx_io(1);
  Net rx(rx_io.io(), lend_config(), seen.fn(), nullptr);
  auto to = rx.listen(*Address::parse("unix:" + dir.path("r.sock")));
  ASSERT_TRUE(to);
  RawLender c;
  c.hello(*to, c.probe + 1);  // not what is at the address: the receiver must not pull
  EXPECT_EQ(c.hello_ack(), 0u);
  uint64_t malformed = rx.stats().refused_malformed;
  c.lend(reinterpret_cast<uintptr_t>(&c.probe), 8);
  EXPECT_TRUE(closed_by_peer(c.fd, 10s));
  EXPECT_EQ(rx.stats().refused_malformed, malformed + 1);
  EXPECT_EQ(seen.next, 0u);
}

TEST(ChannelLendRefusal, LentPartsOverTheFrameLimitAreRefusedBeforeAllocating) {  // CH-15, CH-25
  TempDir dir;
  Seen seen;
  IoThreads rx_io(1);
  Config config = lend_config();
  config.max_frame_bytes = 1 << 20;
  Net rx(rx_io.io(), config, seen.fn(), nullptr);
  auto to = rx.listen(*Address::parse("unix:" + dir.path("r.sock")));
  ASSERT_TRUE(to);
  RawLender c;
  c.hello(*to, c.probe);
  EXPECT_EQ(c.hello_ack(), wire::kAckPull);
  uint64_t oversize = rx.stats().refused_oversize, pulls = rx.stats().pulls;
  c.lend(reinterpret_cast<uintptr_t>(&c.probe), uint64_t{1} << 40);  // claims 1 TiB
  EXPECT_TRUE(closed_by_peer(c.fd, 10s));
  EXPECT_EQ(rx.stats().refused_oversize, oversize + 1);
  EXPECT_EQ(rx.stats().pulls, pulls);  // nothing allocated, nothing pulled
}

TEST(ChannelLendRefusal, APullThatFailsClosesTheConnectionWithTheReason) {  // CH-25
  TempDir dir;
  Seen seen;
  IoThreads rx_io(1);
  LogCapture log;
  Net rx(rx_io.io(), lend_config(), seen.fn(), nullptr);
  auto to = rx.listen(*Address::parse("unix:" + dir.path("r.sock")));
  ASSERT_TRUE(to);
  RawLender c;
  c.hello(*to, c.probe);
  EXPECT_EQ(c.hello_ack(), wire::kAckPull);
  uint64_t failures = rx.stats().pull_failures;
  c.lend(4096, 1 << 20);  // page 1 is never mapped: EFAULT
  EXPECT_TRUE(closed_by_peer(c.fd, 10s));
  EXPECT_EQ(rx.stats().pull_failures, failures + 1);
  EXPECT_TRUE(log.wait_for({"could not pull lent parts", "Bad address"}, 10s));
  EXPECT_EQ(seen.next, 0u);  // nothing delivered
  // The receiver still serves others.
  Returns returns;
  Net tx(rx_io.io(), lend_config(), nullptr, returns.fn());
  tx.send(*to, with_parts(0));
  EXPECT_TRUE(seen.wait_for(1));
  tx.stop();
}

}  // namespace
}  // namespace podium::channel
