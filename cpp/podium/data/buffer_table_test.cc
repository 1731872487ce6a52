// BufferTable tests: capabilities and the release of registrations.
#include "podium/data/buffer_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace podium::data {
namespace {

class BufferTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = Engine::make({});
    ASSERT_TRUE(e) << e.error().message;
    engine_ = std::move(*e);
  }
  std::shared_ptr<Registration> reg(std::vector<uint8_t>& mem) {
    auto r = engine_->register_memory(mem.data(), mem.size(), nullptr);
    EXPECT_TRUE(r);
    return r ? *r : nullptr;
  }
  std::unique_ptr<Engine> engine_;
  BufferTable table_;
};

TEST_F(BufferTableTest, OnlyTheRightTokenIsAccepted) {  // DA-7
  std::vector<uint8_t> mem(4096);
  auto a = table_.add(reg(mem), "owner[0]", true);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->token.size(), 32u);
  EXPECT_TRUE(table_.check(a->id, a->token, false));
  EXPECT_TRUE(table_.check(a->id, a->token, true));
  std::string wrong = a->token;
  wrong[0] = wrong[0] == '0' ? '1' : '0';
  auto r = table_.check(a->id, wrong, false);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(DataErrc::kRefused));
  EXPECT_FALSE(table_.check(a->id, "", false));
  EXPECT_FALSE(table_.drop(a->id, wrong));
  EXPECT_TRUE(table_.check(a->id, a->token, false));  // a refused drop dropped nothing
  auto b = table_.add(reg(mem), "owner[0]", true);
  ASSERT_TRUE(b);
  EXPECT_NE(a->token, b->token);
}

TEST_F(BufferTableTest, AReadOnlyBufferRefusesWrites) {  // DA-7
  std::vector<uint8_t> mem(4096);
  auto a = table_.add(reg(mem), "owner[0]", false);
  ASSERT_TRUE(a);
  EXPECT_TRUE(table_.check(a->id, a->token, false));
  auto r = table_.check(a->id, a->token, true);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("read-only"), std::string::npos);
}

TEST_F(BufferTableTest, DropAndOwnerStopReleaseTheRegistration) {  // DA-8
  std::vector<uint8_t> m1(4096), m2(8192), m3(100);
  auto a = table_.add(reg(m1), "alice[0]", true);
  auto b = table_.add(reg(m2), "bob[1]", true);
  auto c = table_.add(reg(m3), "bob[1]", true);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(engine_->registration_count(), 3u);
  ASSERT_TRUE(table_.drop(a->id, a->token));
  EXPECT_EQ(engine_->registration_count(), 2u);
  auto r = table_.check(a->id, a->token, false);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(DataErrc::kDropped));
  EXPECT_NE(r.error().message.find("was dropped"), std::string::npos);
  EXPECT_TRUE(table_.drop(a->id, a->token));  // again: nothing to do
  EXPECT_EQ(table_.release_owner("bob[1]").regs.size(), 2u);  // no lease: released at once
  EXPECT_EQ(engine_->registration_count(), 0u);
  EXPECT_EQ(table_.size(), 0u);
  r = table_.check(c->id, c->token, false);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("its owner bob[1] stopped"), std::string::npos);
  for (int i = 0; i < 2000; ++i) {
    auto x = table_.add(reg(m1), "alice[0]", true);
    ASSERT_TRUE(x);
    ASSERT_TRUE(table_.drop(x->id, x->token));
  }
  EXPECT_EQ(engine_->registration_count(), 0u);
}

TEST_F(BufferTableTest, ADropKeepsTheMemoryUntilTheLatestLeaseGranted) {  // DA-27, DA-8
  std::vector<uint8_t> mem(4096);
  auto a = table_.add(reg(mem), "alice[0]", true);
  ASSERT_TRUE(a);
  auto t0 = LeaseClock::now();
  using std::chrono::milliseconds;
  BufferTable::Access read{a->id, a->token, false};
  BufferTable::Access write{a->id, a->token, true};
  ASSERT_TRUE(table_.check(std::span(&read, 1), milliseconds(250), t0));
  ASSERT_TRUE(table_.check(std::span(&write, 1), milliseconds(100), t0 + milliseconds(200)));
  ASSERT_TRUE(table_.check(std::span(&read, 1), milliseconds(0), t0 + milliseconds(400)));
  auto d = table_.drop(a->id, a->token);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->until, t0 + milliseconds(300));  // the latest expiry, whichever grant made it
  ASSERT_EQ(d->regs.size(), 1u);
  // Ended at once: new checks are refused, so no lease extends the drop.
  auto r = table_.check(std::span(&read, 1), milliseconds(250), t0 + milliseconds(250));
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(DataErrc::kDropped));
  // A second drop completes no earlier than the first.
  auto again = table_.drop(a->id, a->token);
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->regs.empty());
  EXPECT_EQ(again->until, d->until);
  // The registration lives as long as the caller keeps the Retired.
  EXPECT_EQ(engine_->registration_count(), 1u);
  d->regs.clear();
  EXPECT_EQ(engine_->registration_count(), 0u);
}

TEST_F(BufferTableTest, ADropNamesTheLesseesWhoseLeaseIsNotOver) {  // DA-42, DA-27
  std::vector<uint8_t> mem(4096), other(4096);
  auto a = table_.add(reg(mem), "alice[0]", true);
  auto b = table_.add(reg(other), "alice[0]", true);
  ASSERT_TRUE(a && b);
  auto t0 = LeaseClock::now();
  using std::chrono::milliseconds;
  BufferTable::Access read{a->id, a->token, false};
  BufferTable::Access write{a->id, a->token, true};
  ASSERT_TRUE(table_.check(std::span(&read, 1), milliseconds(250), t0, nullptr, "unix:/r1"));
  ASSERT_TRUE(table_.check(std::span(&write, 1), milliseconds(250), t0, nullptr, "unix:/r1"));
  ASSERT_TRUE(table_.check(std::span(&read, 1), milliseconds(100), t0, nullptr, "unix:/r2"));
  ASSERT_TRUE(table_.check(std::span(&read, 1), milliseconds(0), t0, nullptr, "unix:/r3"));
  auto d = table_.drop(a->id, a->token, t0 + milliseconds(150));
  ASSERT_TRUE(d);
  // r1's lease runs to t0+250; r2's ended at t0+100; r3 was granted none.
  ASSERT_EQ(d->lessees.size(), 1u);
  EXPECT_EQ(d->lessees[0].id, a->id);
  EXPECT_EQ(d->lessees[0].procs, std::vector<std::string>{"unix:/r1"});
  EXPECT_FALSE(d->anonymous);
  EXPECT_EQ(d->until, t0 + milliseconds(250));
  // Once every lessee confirmed its revocation, a second drop has nothing to wait for.
  table_.revoked(a->id);
  auto again = table_.drop(a->id, a->token);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->until, LeaseClock::time_point{});
  // A lease granted to a grantee not known is waited out: no lessee is named.
  BufferTable::Access rb{b->id, b->token, false};
  ASSERT_TRUE(table_.check(std::span(&rb, 1), milliseconds(250), t0, nullptr, "unix:/r1"));
  ASSERT_TRUE(table_.check(std::span(&rb, 1), milliseconds(250), t0));
  auto db = table_.drop(b->id, b->token, t0);
  ASSERT_TRUE(db);
  EXPECT_TRUE(db->lessees.empty());
  EXPECT_TRUE(db->anonymous);
  EXPECT_EQ(db->until, t0 + milliseconds(250));
}

TEST_F(BufferTableTest, ACheckWithoutALeaseMakesItsReaderALesseeForTheHold) {  // DA-42
  std::vector<uint8_t> mem(4096);
  auto a = table_.add(reg(mem), "dave[0]", true);
  ASSERT_TRUE(a);
  auto t0 = LeaseClock::now();
  using std::chrono::milliseconds;
  BufferTable::Access read{a->id, a->token, false};
  // A large transfer: checked, no lease; its transfer runs after the answer.
  ASSERT_TRUE(table_.check(std::span(&read, 1), milliseconds(0), t0, nullptr, "unix:/r4",
                           milliseconds(250)));
  auto d = table_.drop(a->id, a->token, t0 + milliseconds(10));
  ASSERT_TRUE(d);
  ASSERT_EQ(d->lessees.size(), 1u);
  EXPECT_EQ(d->lessees[0].procs, std::vector<std::string>{"unix:/r4"});
  EXPECT_EQ(d->until, t0 + milliseconds(250));  // should r4 not answer
}

TEST_F(BufferTableTest, AnOwnerStopNamesTheLesseesOfEachBuffer) {  // DA-42, DA-27
  std::vector<uint8_t> m1(4096), m2(4096), m3(4096);
  auto a = table_.add(reg(m1), "bob[0]", true);
  auto b = table_.add(reg(m2), "bob[0]", true);
  auto c = table_.add(reg(m3), "carol[0]", true);
  ASSERT_TRUE(a && b && c);
  auto t0 = LeaseClock::now();
  using std::chrono::milliseconds;
  BufferTable::Access ra{a->id, a->token, false}, rb{b->id, b->token, false},
      rc{c->id, c->token, false};
  ASSERT_TRUE(table_.check(std::span(&ra, 1), milliseconds(250), t0, nullptr, "unix:/r1"));
  ASSERT_TRUE(table_.check(std::span(&rb, 1), milliseconds(250), t0, nullptr, "unix:/r2"));
  ASSERT_TRUE(table_.check(std::span(&rc, 1), milliseconds(250), t0, nullptr, "unix:/r3"));
  auto rel = table_.release_owner("bob[0]", t0);
  EXPECT_EQ(rel.regs.size(), 2u);
  ASSERT_EQ(rel.lessees.size(), 2u);
  std::vector<std::pair<uint64_t, std::string>> got;
  for (const auto& l : rel.lessees) {
    for (const auto& p : l.procs) got.emplace_back(l.id, p);
  }
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::pair<uint64_t, std::string>>{{a->id, "unix:/r1"},
                                                                 {b->id, "unix:/r2"}}));
  EXPECT_FALSE(rel.anonymous);
}

TEST_F(BufferTableTest, ALeaseIsGrantedOnlyWhenEveryAccessPasses) {  // DA-27
  std::vector<uint8_t> m1(4096), m2(4096);
  auto a = table_.add(reg(m1), "bob[1]", true);
  auto b = table_.add(reg(m2), "bob[1]", false);
  ASSERT_TRUE(a && b);
  auto t0 = LeaseClock::now();
  std::vector<BufferTable::Access> batch{{a->id, a->token, true}, {b->id, b->token, true}};
  size_t failed = 99;
  auto r = table_.check(batch, std::chrono::milliseconds(500), t0, &failed);
  ASSERT_FALSE(r);  // b is read-only
  EXPECT_EQ(failed, 1u);
  auto rel = table_.release_owner("bob[1]");
  EXPECT_EQ(rel.regs.size(), 2u);
  EXPECT_EQ(rel.until, LeaseClock::time_point{});  // nothing was granted: released at once
  batch = {{a->id, a->token, false}};
  r = table_.check(batch, std::chrono::milliseconds(500), t0, &failed);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("its owner bob[1] stopped"), std::string::npos);
}

TEST_F(BufferTableTest, AnOwnerStopKeepsTheMemoryUntilItsLeasesEnd) {  // DA-27, DA-8
  std::vector<uint8_t> m1(4096), m2(4096);
  auto a = table_.add(reg(m1), "carol[0]", true);
  auto b = table_.add(reg(m2), "carol[0]", true);
  ASSERT_TRUE(a && b);
  auto t0 = LeaseClock::now();
  BufferTable::Access ra{a->id, a->token, false}, rb{b->id, b->token, false};
  ASSERT_TRUE(table_.check(std::span(&ra, 1), std::chrono::milliseconds(100), t0));
  ASSERT_TRUE(table_.check(std::span(&rb, 1), std::chrono::milliseconds(700), t0));
  auto rel = table_.release_owner("carol[0]");
  EXPECT_EQ(rel.until, t0 + std::chrono::milliseconds(700));
  auto d = table_.drop(a->id, a->token);  // a drop after the stop waits for a's own lease
  ASSERT_TRUE(d);
  EXPECT_EQ(d->until, t0 + std::chrono::milliseconds(100));
}

}  // namespace
}  // namespace podium::data
