#include "podium/ndslice/region.h"

#include <gtest/gtest.h>

#include "podium/ndslice/errc.h"

namespace podium::ndslice {
namespace {

Region hosts_gpus() { return Region(*Extent::make({"hosts", "gpus"}, {2, 4})); }

bool mentions(const Error& e, std::string_view text) {
  return e.message.find(text) != std::string::npos;
}

TEST(RegionTest, RootMesh) {
  Region r = hosts_gpus();
  EXPECT_EQ(r.num_ranks(), 8u);
  EXPECT_EQ(r.ndim(), 2u);
  EXPECT_EQ(*r.size("gpus"), 4u);
  EXPECT_EQ(r.base_ranks(), (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(r.to_string(),
            "{'hosts': 2, 'gpus': 4} at Slice{offset: 0, sizes: [2, 4], strides: [4, 1]}");
  Region empty;
  EXPECT_EQ(empty.num_ranks(), 1u);
  EXPECT_EQ(empty.base_ranks(), (std::vector<size_t>{0}));
}

TEST(RegionTest, SelectIndexRemovesDimension) {
  // SL-6: a[:, 2]
  auto r = hosts_gpus().select("gpus", 2);
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_EQ(r->labels(), (std::vector<std::string>{"hosts"}));
  EXPECT_EQ(r->base_ranks(), (std::vector<size_t>{2, 6}));
  // Negative indices count from the end, as in Python.
  EXPECT_EQ(hosts_gpus().select("gpus", -1)->base_ranks(), (std::vector<size_t>{3, 7}));
  EXPECT_EQ(hosts_gpus().select("hosts", 1)->base_ranks(), (std::vector<size_t>{4, 5, 6, 7}));
  // Down to no dimensions: one rank.
  auto one = hosts_gpus().select("hosts", 1)->select("gpus", 3);
  ASSERT_TRUE(one);
  EXPECT_EQ(one->ndim(), 0u);
  EXPECT_EQ(one->base_ranks(), (std::vector<size_t>{7}));
}

TEST(RegionTest, SelectRangeKeepsDimension) {
  // SL-6: a[:, 1::2]
  auto r = hosts_gpus().select("gpus", Range{1, std::nullopt, 2});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->sizes(), (std::vector<size_t>{2, 2}));
  EXPECT_EQ(r->base_ranks(), (std::vector<size_t>{1, 3, 5, 7}));
  EXPECT_EQ(hosts_gpus().select("gpus", Range{-2})->base_ranks(),
            (std::vector<size_t>{2, 3, 6, 7}));
  // Clamped like Python: stop beyond the size is the size.
  EXPECT_EQ(hosts_gpus().select("gpus", (Range{2, 100}))->base_ranks(),
            (std::vector<size_t>{2, 3, 6, 7}));
  // A step past the end leaves one index.
  EXPECT_EQ(hosts_gpus().select("gpus", (Range{1, 4, 10}))->base_ranks(),
            (std::vector<size_t>{1, 5}));
}

TEST(RegionTest, SelectErrors) {
  auto unknown = hosts_gpus().select("cpus", 0);
  ASSERT_FALSE(unknown);
  EXPECT_TRUE(unknown.error().is(NdsliceErrc::kUnknownLabel));
  EXPECT_TRUE(mentions(unknown.error(), "'cpus'")) << unknown.error().message;

  auto out = hosts_gpus().select("gpus", 4);
  ASSERT_FALSE(out);
  EXPECT_TRUE(out.error().is(NdsliceErrc::kOutOfRange));
  EXPECT_TRUE(mentions(out.error(), "'gpus'")) << out.error().message;
  EXPECT_TRUE(mentions(out.error(), "-4..3")) << out.error().message;
  EXPECT_TRUE(hosts_gpus().select("gpus", -5).error().is(NdsliceErrc::kOutOfRange));
  EXPECT_TRUE(hosts_gpus()
                  .select("gpus", std::numeric_limits<int64_t>::min())
                  .error()
                  .is(NdsliceErrc::kOutOfRange));

  EXPECT_TRUE(hosts_gpus().select("cpus", Range{}).error().is(NdsliceErrc::kUnknownLabel));
  EXPECT_TRUE(hosts_gpus().select("gpus", (Range{0, 4, 0})).error().is(NdsliceErrc::kBadStep));
  EXPECT_TRUE(hosts_gpus().select("gpus", (Range{4, 0, -1})).error().is(NdsliceErrc::kBadStep));
  auto empty = hosts_gpus().select("gpus", Range{5, 10});
  ASSERT_FALSE(empty);
  EXPECT_TRUE(empty.error().is(NdsliceErrc::kOutOfRange));
  EXPECT_TRUE(mentions(empty.error(), "size 4")) << empty.error().message;
  EXPECT_TRUE(hosts_gpus().select("gpus", (Range{2, 2})).error().is(NdsliceErrc::kOutOfRange));
}

TEST(RegionTest, SplitReshapesOneDimension) {
  Region r(*Extent::make({"hosts", "gpus"}, {2, 8}));
  // SL-6: reshape of the gpus axis into (2, 4), row-major.
  auto split = r.split("gpus", {"nodes", "local"}, {2, -1});
  ASSERT_TRUE(split) << split.error().to_string();
  EXPECT_EQ(split->labels(), (std::vector<std::string>{"hosts", "nodes", "local"}));
  EXPECT_EQ(split->sizes(), (std::vector<size_t>{2, 2, 4}));
  EXPECT_EQ(split->base_ranks(), r.base_ranks());
  auto local1 = split->select("local", 1);
  EXPECT_EQ(local1->base_ranks(), (std::vector<size_t>{1, 5, 9, 13}));
  // Reusing the split label is allowed: it is gone after the split.
  EXPECT_TRUE(r.split("gpus", {"gpus", "x"}, {4, 2}));
}

TEST(RegionTest, SplitErrors) {
  Region r(*Extent::make({"hosts", "gpus"}, {2, 8}));
  EXPECT_TRUE(r.split("cpus", {"a"}, {8}).error().is(NdsliceErrc::kUnknownLabel));
  EXPECT_TRUE(r.split("gpus", {"a", "b"}, {3, 3}).error().is(NdsliceErrc::kBadShape));
  EXPECT_TRUE(r.split("gpus", {"a", "b"}, {3, -1}).error().is(NdsliceErrc::kBadShape));
  EXPECT_TRUE(r.split("gpus", {"a", "b"}, {-1, -1}).error().is(NdsliceErrc::kBadShape));
  EXPECT_TRUE(r.split("gpus", {"a", "b"}, {0, 8}).error().is(NdsliceErrc::kBadShape));
  EXPECT_TRUE(r.split("gpus", {"a", "b"}, {8}).error().is(NdsliceErrc::kBadShape));
  EXPECT_TRUE(r.split("gpus", {}, {}).error().is(NdsliceErrc::kBadShape));
  EXPECT_TRUE(r.split("gpus", {"a", "b"}, {1 << 30, 1 << 30}).error().is(NdsliceErrc::kBadShape));
  auto dup = r.split("gpus", {"hosts", "b"}, {2, 4});
  ASSERT_FALSE(dup);
  EXPECT_TRUE(dup.error().is(NdsliceErrc::kDuplicateLabel));
  EXPECT_TRUE(mentions(dup.error(), "split 'gpus'")) << dup.error().message;
}

TEST(RegionTest, Flatten) {
  // SL-6: same base ranks, same order.
  auto flat = hosts_gpus().flatten("all");
  ASSERT_TRUE(flat);
  EXPECT_EQ(flat->labels(), (std::vector<std::string>{"all"}));
  EXPECT_EQ(flat->base_ranks(), hosts_gpus().base_ranks());

  // Evenly spaced but not contiguous: every other gpu.
  auto odd = hosts_gpus().select("gpus", Range{1, std::nullopt, 2})->flatten("x");
  ASSERT_TRUE(odd);
  EXPECT_EQ(odd->base_ranks(), (std::vector<size_t>{1, 3, 5, 7}));

  // A 2x2 block of a 2x4 mesh is 0, 1, 4, 5: no single stride describes it.
  auto block = hosts_gpus().select("gpus", Range{0, 2})->flatten("x");
  ASSERT_FALSE(block);
  EXPECT_TRUE(block.error().is(NdsliceErrc::kNotFlattenable));

  auto scalar = Region().flatten("x");
  ASSERT_TRUE(scalar);
  EXPECT_EQ(scalar->sizes(), (std::vector<size_t>{1}));
  EXPECT_TRUE(hosts_gpus().flatten("").error().is(NdsliceErrc::kBadShape));
}

TEST(RegionTest, Rename) {
  auto r = hosts_gpus().rename("gpus", "devices");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->labels(), (std::vector<std::string>{"hosts", "devices"}));
  EXPECT_EQ(r->slice(), hosts_gpus().slice());
  EXPECT_EQ(*hosts_gpus().rename("gpus", "gpus"), hosts_gpus());
  EXPECT_TRUE(hosts_gpus().rename("cpus", "x").error().is(NdsliceErrc::kUnknownLabel));
  EXPECT_TRUE(hosts_gpus().rename("gpus", "hosts").error().is(NdsliceErrc::kDuplicateLabel));
  EXPECT_TRUE(hosts_gpus().rename("gpus", "").error().is(NdsliceErrc::kBadShape));
}

TEST(RegionTest, RanksPointsAndBaseRanks) {
  // gpus 1 and 3 of host 1: base ranks 5 and 7.
  Region r = *hosts_gpus().select("hosts", Range{1})->select("gpus", Range{1, 4, 2});
  EXPECT_EQ(r.base_ranks(), (std::vector<size_t>{5, 7}));
  auto p = r.point_of(1);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->to_string(), "{'hosts': 0/1, 'gpus': 1/2}");
  EXPECT_EQ(*r.rank_of_point(*p), 1u);
  EXPECT_EQ(*r.base_rank(1), 7u);
  EXPECT_EQ(*r.rank_of_base(7), 1u);
  EXPECT_TRUE(r.rank_of_base(6).error().is(NdsliceErrc::kOutOfRange));
  EXPECT_TRUE(r.base_rank(2).error().is(NdsliceErrc::kOutOfRange));
  EXPECT_TRUE(r.point_of(2).error().is(NdsliceErrc::kOutOfRange));
  EXPECT_TRUE(r.rank_of_point(*hosts_gpus().point_of(1)).error().is(NdsliceErrc::kBadShape));
}

TEST(RegionTest, MakeChecksLabelsAgainstSlice) {
  // SL-5
  Slice s = *Slice::make(3, {2}, {2});
  EXPECT_EQ(Region::make({"x"}, s)->base_ranks(), (std::vector<size_t>{3, 5}));
  EXPECT_TRUE(Region::make({"x", "y"}, s).error().is(NdsliceErrc::kBadShape));
  EXPECT_TRUE(Region::make({}, s).error().is(NdsliceErrc::kBadShape));
}

}  // namespace
}  // namespace podium::ndslice
