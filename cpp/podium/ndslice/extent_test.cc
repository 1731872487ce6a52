#include "podium/ndslice/extent.h"

#include <gtest/gtest.h>

#include "podium/ndslice/errc.h"
#include "podium/ndslice/point.h"

namespace podium::ndslice {
namespace {

Extent hosts_gpus() { return *Extent::make({"hosts", "gpus"}, {2, 4}); }

TEST(ExtentTest, BasicAccessors) {
  Extent e = hosts_gpus();
  EXPECT_EQ(e.ndim(), 2u);
  EXPECT_EQ(e.num_ranks(), 8u);
  EXPECT_EQ(e.labels(), (std::vector<std::string>{"hosts", "gpus"}));
  EXPECT_EQ(e.sizes(), (std::vector<size_t>{2, 4}));
  EXPECT_EQ(*e.size("gpus"), 4u);
  EXPECT_EQ(e.dim_of("gpus"), 1u);
  EXPECT_EQ(e.dim_of("cpus"), std::nullopt);
  EXPECT_EQ(e, hosts_gpus());
  EXPECT_NE(e, *Extent::make({"gpus", "hosts"}, {4, 2}));
}

TEST(ExtentTest, NoDimensionsIsOneRank) {
  // SL-1: the empty product is 1.
  Extent e;
  EXPECT_EQ(e.num_ranks(), 1u);
  EXPECT_EQ(e.to_string(), "{}");
  EXPECT_EQ(*Extent::make({}, {}), e);
  auto p = e.point_of_rank(0);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->to_string(), "{}");
  EXPECT_TRUE(e.point_of_rank(1).error().is(NdsliceErrc::kOutOfRange));
}

TEST(ExtentTest, MakeRejectsInvalid) {
  // SL-1
  EXPECT_TRUE(Extent::make({"a", "b"}, {1}).error().is(NdsliceErrc::kBadShape));
  EXPECT_TRUE(Extent::make({"a", "a"}, {1, 2}).error().is(NdsliceErrc::kDuplicateLabel));
  EXPECT_TRUE(Extent::make({""}, {1}).error().is(NdsliceErrc::kBadShape));
  EXPECT_TRUE(Extent::make({"a", "b"}, {3, 0}).error().is(NdsliceErrc::kBadShape));
  size_t big = size_t{1} << 40;
  EXPECT_TRUE(Extent::make({"a", "b"}, {big, big}).error().is(NdsliceErrc::kBadShape));
  auto dup = Extent::make({"hosts", "gpus", "hosts"}, {1, 2, 3});
  EXPECT_EQ(dup.error().subsystem, Subsystem::kNdslice);
  EXPECT_NE(dup.error().message.find("'hosts'"), std::string::npos) << dup.error().message;
}

TEST(ExtentTest, SizeOfUnknownLabel) {
  auto size = hosts_gpus().size("cpus");
  ASSERT_FALSE(size);
  EXPECT_TRUE(size.error().is(NdsliceErrc::kUnknownLabel));
  EXPECT_NE(size.error().message.find("'cpus'"), std::string::npos);
}

TEST(ExtentTest, ToString) { EXPECT_EQ(hosts_gpus().to_string(), "{'hosts': 2, 'gpus': 4}"); }

TEST(ExtentTest, RankCoordinateRoundTrip) {
  // SL-2, over every rank of a few shapes.
  for (const Extent& e : {*Extent::make({"a"}, {5}), *Extent::make({"a", "b", "c"}, {2, 3, 4}),
                          *Extent::make({"x", "y", "z", "w"}, {1, 3, 1, 2})}) {
    for (size_t rank = 0; rank < e.num_ranks(); ++rank) {
      auto p = e.point_of_rank(rank);
      ASSERT_TRUE(p) << p.error().to_string();
      EXPECT_EQ(p->rank(), rank);
      EXPECT_EQ(*e.rank_of(p->coords()), rank);
    }
  }
  // Row-major: the last dimension varies fastest.
  Extent e = *Extent::make({"a", "b", "c"}, {2, 3, 4});
  EXPECT_EQ(e.point_of_rank(13)->coords(), (std::vector<size_t>{1, 0, 1}));
}

TEST(ExtentTest, RankOfRejectsBadCoordinates) {
  Extent e = hosts_gpus();
  std::vector<size_t> short_coords{1};
  std::vector<size_t> too_big{1, 4};
  EXPECT_TRUE(e.rank_of(short_coords).error().is(NdsliceErrc::kBadShape));
  EXPECT_TRUE(e.rank_of(too_big).error().is(NdsliceErrc::kOutOfRange));
  EXPECT_TRUE(e.point_of_rank(8).error().is(NdsliceErrc::kOutOfRange));
}

TEST(PointTest, ToStringMatchesMonarch) {
  auto p = hosts_gpus().point_of_rank(1);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->to_string(), "{'hosts': 0/2, 'gpus': 1/4}");
  EXPECT_EQ(hosts_gpus().point_of_rank(7)->to_string(), "{'hosts': 1/2, 'gpus': 3/4}");
}

TEST(PointTest, GetAndMake) {
  auto p = Point::make(hosts_gpus(), {1, 2});
  ASSERT_TRUE(p);
  EXPECT_EQ(p->rank(), 6u);
  EXPECT_EQ(*p->get("hosts"), 1u);
  EXPECT_EQ(*p->get("gpus"), 2u);
  EXPECT_TRUE(p->get("cpus").error().is(NdsliceErrc::kUnknownLabel));
  EXPECT_EQ(*p, *hosts_gpus().point_of_rank(6));
  EXPECT_TRUE(Point::make(hosts_gpus(), {2, 0}).error().is(NdsliceErrc::kOutOfRange));
  EXPECT_TRUE(Point::make(hosts_gpus(), {0}).error().is(NdsliceErrc::kBadShape));
}

}  // namespace
}  // namespace podium::ndslice
