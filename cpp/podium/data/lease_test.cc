// LeaseCache tests: the reader's leases (DA-26) and their revocation (DA-42).
#include "podium/data/lease.h"

#include <gtest/gtest.h>

namespace podium::data {
namespace {

using std::chrono::milliseconds;

TEST(LeaseCache, ALeaseRunsFromWhenTheCheckWasSent) {  // DA-26
  LeaseCache c;
  auto sent = LeaseClock::now();
  c.grant("tcp:a:1", 7, false, "tok", sent, milliseconds(250));
  auto left = c.usable("tcp:a:1", 7, false, "tok", sent + milliseconds(100));
  ASSERT_TRUE(left);
  EXPECT_EQ(*left, milliseconds(150));
  EXPECT_TRUE(c.usable("tcp:a:1", 7, false, "tok", sent + milliseconds(125)));
  // Less than half left: the next transfer checks again (and renews).
  EXPECT_FALSE(c.usable("tcp:a:1", 7, false, "tok", sent + milliseconds(126)));
  EXPECT_EQ(c.left("tcp:a:1", 7, false, sent + milliseconds(200)), milliseconds(50));
  EXPECT_EQ(c.left("tcp:a:1", 7, false, sent + milliseconds(250)), LeaseClock::duration::zero());
  c.grant("tcp:a:1", 7, false, "tok", sent + milliseconds(200), milliseconds(250));
  EXPECT_TRUE(c.usable("tcp:a:1", 7, false, "tok", sent + milliseconds(300)));
}

TEST(LeaseCache, OnlyTheSameTokenKindOwnerAndBufferMatch) {  // DA-26
  LeaseCache c;
  auto now = LeaseClock::now();
  c.grant("tcp:a:1", 7, false, "tok", now, milliseconds(250));
  EXPECT_TRUE(c.usable("tcp:a:1", 7, false, "tok", now));
  EXPECT_FALSE(c.usable("tcp:a:1", 7, true, "tok", now));    // a read lease is no write lease
  EXPECT_FALSE(c.usable("tcp:a:1", 7, false, "other", now));  // a forged token gets nothing
  EXPECT_FALSE(c.usable("tcp:a:1", 8, false, "tok", now));
  EXPECT_FALSE(c.usable("tcp:b:1", 7, false, "tok", now));
  c.grant("tcp:a:1", 7, true, "tok", now, milliseconds(250));
  EXPECT_TRUE(c.usable("tcp:a:1", 7, true, "tok", now));
  c.forget("tcp:a:1", 7, true);  // a leased write failed
  EXPECT_FALSE(c.usable("tcp:a:1", 7, true, "tok", now));
  EXPECT_TRUE(c.usable("tcp:a:1", 7, false, "tok", now));
  c.grant("tcp:a:1", 7, false, "tok", now, LeaseClock::duration::zero());  // no lease granted
  EXPECT_FALSE(c.usable("tcp:a:1", 7, false, "tok", now));
  EXPECT_EQ(c.size(), 0u);
}

TEST(LeaseCache, ARevocationWaitsForTheTransfersThatHoldTheBuffer) {  // DA-42
  LeaseCache c;
  auto now = LeaseClock::now();
  c.grant("tcp:a:1", 7, false, "tok", now, milliseconds(250));
  c.grant("tcp:a:1", 7, true, "tok", now, milliseconds(250));
  ASSERT_TRUE(c.hold("tcp:a:1", 7, false, "tok", now));  // a leased read starts
  EXPECT_FALSE(c.hold("tcp:a:1", 7, false, "other", now));  // a forged token holds nothing
  ASSERT_TRUE(c.hold_granted("tcp:a:1", 7, now));  // a checked write, its lease just granted
  EXPECT_EQ(c.holds("tcp:a:1", 7), 2u);
  int done = 0;
  c.revoke("tcp:a:1", 7, now, [&done] { ++done; });
  EXPECT_EQ(done, 0);  // two transfers still hold it
  // Both leases are gone; a grant answered before the drop, arriving now, is refused, and
  // so is any new hold.
  EXPECT_FALSE(c.usable("tcp:a:1", 7, false, "tok", now));
  EXPECT_FALSE(c.usable("tcp:a:1", 7, true, "tok", now));
  c.grant("tcp:a:1", 7, false, "tok", now, milliseconds(250));
  EXPECT_FALSE(c.hold("tcp:a:1", 7, false, "tok", now));
  EXPECT_FALSE(c.hold_granted("tcp:a:1", 7, now));
  c.release("tcp:a:1", 7);
  EXPECT_EQ(done, 0);
  c.release("tcp:a:1", 7);
  EXPECT_EQ(done, 1);  // the last hold ended: the revocation is answered, once
  c.release("tcp:a:1", 7);
  EXPECT_EQ(done, 1);
  EXPECT_EQ(c.holds("tcp:a:1", 7), 0u);
  // After kRevokedKept, (owner, id) may be leased again (ids are not reused; a clock check).
  EXPECT_TRUE(c.hold_granted("tcp:a:1", 7, now + LeaseCache::kRevokedKept));
}

TEST(LeaseCache, ARevocationWithNoHoldIsAnsweredAtOnceAndTouchesNoOtherBuffer) {  // DA-42
  LeaseCache c;
  auto now = LeaseClock::now();
  c.grant("tcp:a:1", 8, false, "tok", now, milliseconds(250));
  c.grant("tcp:a:1", 9, false, "tok", now, milliseconds(250));
  c.grant("tcp:b:1", 8, false, "tok", now, milliseconds(250));
  int done = 0;
  c.revoke("tcp:a:1", 8, now, [&done] { ++done; });
  EXPECT_EQ(done, 1);
  EXPECT_FALSE(c.usable("tcp:a:1", 8, false, "tok", now));
  EXPECT_TRUE(c.usable("tcp:a:1", 9, false, "tok", now));
  EXPECT_TRUE(c.usable("tcp:b:1", 8, false, "tok", now));
}

TEST(LeaseCache, RevocationsAreForgottenOnceNoLeaseCanOutliveThem) {  // DA-42
  LeaseCache c;
  auto t0 = LeaseClock::now();
  for (uint64_t id = 1; id <= 5000; ++id) c.revoke("tcp:a:1", id, t0, [] {});
  EXPECT_EQ(c.revocations_kept(), 5000u);  // each still refuses a late grant
  // Once kRevokedKept has passed, expired ones are swept, amortized: the sweep at 4096 found
  // none expired, so the next runs at twice that, 8192. Revocations kept stay within twice
  // those of any kRevokedKept window: thousands of drops do not grow the reader's memory.
  auto t1 = t0 + LeaseCache::kRevokedKept + milliseconds(1);
  for (uint64_t id = 5001; id <= 8192; ++id) c.revoke("tcp:a:1", id, t1, [] {});
  EXPECT_EQ(c.revocations_kept(), 8192u);
  c.revoke("tcp:a:1", 8193, t1, [] {});
  EXPECT_EQ(c.revocations_kept(), 3193u);  // the 5000 of t0 are gone
}

TEST(LeaseConfig, FromTheEnvironment) {
  ::setenv("PODIUM_RDMA_LEASE_MS", "0", 1);
  ::setenv("PODIUM_RDMA_LEASE_MAX_BYTES", "8192", 1);
  auto c = LeaseConfig::from_env();
  EXPECT_EQ(c.lease, milliseconds(0));
  EXPECT_EQ(c.max_bytes, 8192u);
  ::unsetenv("PODIUM_RDMA_LEASE_MS");
  ::unsetenv("PODIUM_RDMA_LEASE_MAX_BYTES");
  c = LeaseConfig::from_env();
  EXPECT_EQ(c.lease, milliseconds(250));
  EXPECT_EQ(c.max_bytes, uint64_t{4} << 20);
}

}  // namespace
}  // namespace podium::data
