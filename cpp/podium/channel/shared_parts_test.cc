// Large parts for one receiver copied into shared blocks that the receiver maps (CH-29,
// WI-9), instead of being pulled (CH-25).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include "podium/channel/net.h"
#include "podium/channel/shared_parts.h"
#include "podium/channel/test_util.h"
#include "podium/wire/message.h"

namespace podium::channel {
namespace {

using namespace std::chrono_literals;
using namespace testing;

constexpr size_t kPart = size_t{3} << 20;

Config shared_config() {
  Config c = test_config();
  c.lend_min_bytes = 64 * 1024;
  c.shared_part_min_bytes = size_t{1} << 20;
  return c;
}

// Envelope `i`: part 0 is its number, part 1 kPart bytes of one value that depends on i.
wire::Envelope numbered(uint64_t i, bool fan_out = false) {
  wire::Envelope e;
  e.kind = 1;
  e.dest = "proc[1].actor[0]";
  e.sender = "proc[0].actor[0]";
  e.order_seq = i;
  e.fan_out = fan_out;
  e.parts.push_back(Buffer::copy_of(std::string_view(reinterpret_cast<const char*>(&i), sizeof i)));
  e.parts.push_back(Buffer::from_string(std::string(kPart, char('a' + i % 26))));
  return e;
}

bool filled_with(const Buffer& b, char c) {
  for (size_t k = 0; k < b.size(); k += 4093) {
    if (b.view()[k] != c) return false;
  }
  return b.size() == kPart && b.view().back() == c;
}

// The descriptor a receiver gets for part `i` of `env` (WI-9), after share_parts().
wire::LentPart lent_of(const wire::Envelope& env, uint32_t i) {
  wire::LentPart l{i, reinterpret_cast<uint64_t>(env.parts[i].data()), env.parts[i].size()};
  for (const wire::SharedRef& ref : env.shared) {
    if (ref.index == i) {
      l.fd = ref.fd;
      l.ino = ref.ino;
      l.gen = ref.gen;
    }
  }
  return l;
}

// A receiver that keeps what it was given while `hold` is set.
struct Kept {
  std::mutex mu;
  std::condition_variable cv;
  bool hold = false;
  std::vector<Buffer> parts;
  uint64_t next = 0;
  std::string error;
  DeliverFn fn() {
    return [this](wire::Envelope&& e) {
      std::lock_guard lock(mu);
      if (error.empty() && (e.order_seq != next || !filled_with(e.parts.at(1), char('a' + next % 26)))) {
        error = "envelope " + std::to_string(next) + " damaged or out of order";
      }
      if (error.empty() && !e.parts[1].sole_writer()) error = "not the receiver's alone";
      if (hold) parts.push_back(std::move(e.parts[1]));
      ++next;
      cv.notify_all();
    };
  }
  bool wait_for(uint64_t n) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, 20s, [&] { return next >= n; });
  }
};

struct Pair {
  TempDir dir;
  Kept kept;
  Returns returns;
  IoThreads rx_io{2}, tx_io{2};
  Net rx{rx_io.io(), shared_config(), kept.fn(), nullptr};
  Net tx{tx_io.io(), shared_config(), nullptr, returns.fn()};
  Address to;
  uint64_t sent = 0;

  // Listens, and sends envelope 0 so that the HelloAck (which says the peer pulls) is read
  // before anything the test counts.
  void start() {
    auto a = rx.listen(*Address::parse("unix:@" + unique_name("shared")));
    ASSERT_TRUE(a) << a.error().to_string();
    to = *a;
    send();
    ASSERT_TRUE(kept.wait_for(1));
    ASSERT_TRUE(eventually([&] { return tx.unacknowledged(to) == 0; }, 10s));
  }
  void send(bool fan_out = false) { tx.send(to, numbered(sent++, fan_out)); }
};

TEST(SharedParts, APartForOneReceiverIsMappedAndItsBlockServesTheNextOne) {  // CH-29, WI-9
  Pair p;
  p.start();
  auto before = p.rx.stats();
  for (int i = 0; i < 10; ++i) {
    p.send();
    ASSERT_TRUE(p.kept.wait_for(p.sent));  // released at once: the next copy may reuse it
    ASSERT_TRUE(eventually([&] { return p.tx.unacknowledged(p.to) == 0; }, 10s));
  }
  auto after = p.rx.stats();
  EXPECT_EQ(p.kept.error, "");
  EXPECT_EQ(after.shared_mapped - before.shared_mapped, 10u);
  EXPECT_EQ(after.shared_map_failed, before.shared_map_failed);
  // A block's first part is mapped on the pullers; a part in a block mapped already is
  // claimed on the io thread, with no pull. (A second block is made when the ack overtakes
  // the receiver's release, so not every one of the ten reuses the first.)
  EXPECT_LT(after.pulls - before.pulls, 10u);
  EXPECT_LE(after.shared_blocks_made - before.shared_blocks_made, 1u);
  EXPECT_EQ(p.returns.size(), 0u);
}

TEST(SharedParts, ABlockTheReceiverHoldsIsNeverWrittenAgain) {  // CH-29
  Pair p;
  p.start();
  {
    std::lock_guard lock(p.kept.mu);
    p.kept.hold = true;
  }
  auto before = p.tx.stats();
  for (int i = 0; i < 6; ++i) p.send();
  ASSERT_TRUE(p.kept.wait_for(p.sent));
  ASSERT_TRUE(eventually([&] { return p.tx.unacknowledged(p.to) == 0; }, 10s));
  for (int i = 0; i < 6; ++i) p.send();  // each needs a block of its own while those are held
  ASSERT_TRUE(p.kept.wait_for(p.sent));
  EXPECT_EQ(p.kept.error, "");
  auto held = p.tx.stats();
  EXPECT_EQ(held.shared_mapped - before.shared_mapped, 12u);
  std::lock_guard lock(p.kept.mu);
  ASSERT_EQ(p.kept.parts.size(), 12u);
  std::set<const std::byte*> blocks;
  for (const Buffer& b : p.kept.parts) blocks.insert(b.data());
  EXPECT_EQ(blocks.size(), 12u);  // twelve blocks held: none was handed out twice
  for (size_t k = 0; k < p.kept.parts.size(); ++k) {
    EXPECT_TRUE(filled_with(p.kept.parts[k], char('a' + (k + 1) % 26))) << "part " << k + 1;
  }
  p.kept.parts.clear();  // released: the blocks serve the next sends
  p.kept.hold = false;
}

TEST(SharedParts, APartForSeveralReceiversIsLentNotCopied) {  // CH-29
  Pair p;
  p.start();
  auto before = p.tx.stats();
  for (int i = 0; i < 3; ++i) p.send(/*fan_out=*/true);
  ASSERT_TRUE(p.kept.wait_for(p.sent));
  auto after = p.tx.stats();
  EXPECT_EQ(p.kept.error, "");
  EXPECT_EQ(after.shared_copied, before.shared_copied);
  EXPECT_EQ(after.pulls - before.pulls, 3u);
}

// The two sides in one process: a copy, then the receiver's claim by hand.
TEST(SharedParts, AClaimNeedsTheGenerationLentAndOnlyOneSucceeds) {  // CH-29, WI-9
  auto before = internal::shared_counts();
  wire::Envelope env = numbered(5);
  internal::share_parts(env, size_t{1} << 20);
  ASSERT_EQ(env.shared.size(), 1u);
  const wire::SharedRef ref = env.shared[0];
  EXPECT_EQ(ref.index, 1u);
  EXPECT_TRUE(filled_with(env.parts[1], 'f'));
  // Sealed at its size: nobody can shrink it under a receiver's mapping.
  EXPECT_NE(::ftruncate(ref.fd, 0), 0);
  wire::LentPart l = lent_of(env, 1);
  wire::LentPart stale = l;
  stale.gen = ref.gen + 1;
  EXPECT_FALSE(internal::map_shared(::getpid(), stale));
  wire::LentPart other = l;
  other.ino = ref.ino + 1;
  EXPECT_FALSE(internal::map_shared(::getpid(), other));  // not the memfd named
  auto got = internal::map_shared(::getpid(), l);
  ASSERT_TRUE(got);
  EXPECT_TRUE(got->sole_writer());
  EXPECT_TRUE(filled_with(*got, 'f'));
  EXPECT_FALSE(internal::map_shared(::getpid(), l));  // claimed once only
  // The sender lets go (an ack): the block is still the receiver's, so the next copy of its
  // size takes another.
  env.parts.clear();
  wire::Envelope next = numbered(6);
  internal::share_parts(next, size_t{1} << 20);
  ASSERT_EQ(next.shared.size(), 1u);
  EXPECT_NE(next.shared[0].ino, ref.ino);
  std::memset(const_cast<std::byte*>(got->data()), 'z', 16);  // the receiver's to write
  got.reset();  // released: free for the sender again
  next.parts.clear();
  wire::Envelope third = numbered(7);
  internal::share_parts(third, size_t{1} << 20);
  ASSERT_EQ(third.shared.size(), 1u);
  EXPECT_TRUE(filled_with(third.parts[1], 'h'));
  auto after = internal::shared_counts();
  EXPECT_EQ(after.copied - before.copied, 3u);
  EXPECT_EQ(after.mapped - before.mapped, 1u);
}

TEST(SharedParts, ABlockHeldAcrossAForkIsNeverWrittenAgain) {  // CH-29
  constexpr size_t kOdd = (size_t{7} << 20) + 4096;  // a size class no other test uses
  auto one_part = [&](char c) {
    wire::Envelope e;
    e.parts.push_back(Buffer::from_string(std::string(kOdd, c)));
    internal::share_parts(e, size_t{1} << 20);
    return e;
  };
  wire::Envelope env = one_part('q');
  ASSERT_EQ(env.shared.size(), 1u);
  const wire::SharedRef ref = env.shared[0];
  wire::LentPart l = lent_of(env, 0);
  auto got = internal::map_shared(::getpid(), l);
  ASSERT_TRUE(got);
  env.parts.clear();  // the sender lets go; the receiver (this process) holds the block
  pid_t child = ::fork();
  if (child == 0) {
    got.reset();  // a child's release of its parent's part does nothing
    ::_exit(0);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  wire::Envelope second = one_part('r');
  ASSERT_EQ(second.shared.size(), 1u);
  EXPECT_NE(second.shared[0].ino, ref.ino);  // still held here
  got.reset();  // released after a fork: the child may still read it, so it stays held
  second.parts.clear();
  wire::Envelope third = one_part('s');
  ASSERT_EQ(third.shared.size(), 1u);
  EXPECT_NE(third.shared[0].ino, ref.ino);  // (it would be the first free block of its size)
  EXPECT_TRUE(third.parts[0].view().front() == 's' && third.parts[0].view().back() == 's');
}

TEST(SharedParts, IdleBlocksAndMappingsGoWithoutAnotherSend) {  // CH-29
  {
    wire::Envelope env = numbered(2);
    internal::share_parts(env, size_t{1} << 20);
    ASSERT_EQ(env.shared.size(), 1u);
    auto got = internal::map_shared(::getpid(), lent_of(env, 1));
    ASSERT_TRUE(got);
    EXPECT_GE(internal::shared_counts().blocks, 1u);
    EXPECT_GE(internal::shared_counts().mappings, 1u);
  }  // both sides let go, and nothing is sent after
  // The puller threads sweep once a second while idle; kSharedIdle is 2 s.
  EXPECT_TRUE(eventually(
      [] {
        auto c = internal::shared_counts();
        return c.blocks == 0 && c.mappings == 0 && c.bytes == 0;
      },
      15s));
}

TEST(SharedParts, APartBelowTheThresholdOrWithNoBlockNameIsLeftAlone) {  // CH-29
  wire::Envelope env = numbered(1);
  internal::share_parts(env, kPart + 1);
  EXPECT_TRUE(env.shared.empty());
  wire::LentPart plain = lent_of(env, 1);  // names no block
  EXPECT_FALSE(internal::map_shared(::getpid(), plain));
  wire::LentPart bogus = plain;
  bogus.fd = 0;  // stdin: not a sealed memfd
  bogus.gen = 1;
  EXPECT_FALSE(internal::map_shared(::getpid(), bogus));
}

}  // namespace
}  // namespace podium::channel
