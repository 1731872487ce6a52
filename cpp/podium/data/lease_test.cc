// LeaseCache tests: the reader's leases (DA-26).
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
