#include "podium/ndslice/selection.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "podium/ndslice/errc.h"
#include "podium/ndslice/region.h"

namespace podium::ndslice {
namespace {

using Ranks = std::vector<size_t>;

Region hosts_gpus() { return Region(*Extent::make({"hosts", "gpus"}, {2, 4})); }

TEST(SelectionTest, Leaves) {
  Region r = hosts_gpus();
  EXPECT_EQ(*Selection::all().base_ranks(r), (Ranks{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(*Selection().base_ranks(r), (Ranks{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(*Selection::none().base_ranks(r), Ranks{});
  EXPECT_EQ(*Selection::first().base_ranks(r), Ranks{0});
  EXPECT_EQ(*Selection::first("gpus").base_ranks(r), (Ranks{0, 4}));
  EXPECT_EQ(*Selection::first("hosts").base_ranks(r), (Ranks{0, 1, 2, 3}));
  EXPECT_EQ(*Selection::range("gpus", {1, std::nullopt, 2}).base_ranks(r), (Ranks{1, 3, 5, 7}));
  // Out-of-range bounds clamp, and a range may pick nothing.
  EXPECT_EQ(*Selection::range("gpus", {-2, 100}).base_ranks(r), (Ranks{2, 3, 6, 7}));
  EXPECT_EQ(*Selection::range("gpus", {9, 12}).base_ranks(r), Ranks{});
}

TEST(SelectionTest, Combinators) {
  Region r = hosts_gpus();
  Selection odd_gpus = Selection::range("gpus", {1, std::nullopt, 2});
  EXPECT_EQ(*(odd_gpus & Selection::first("hosts")).base_ranks(r), (Ranks{1, 3}));
  EXPECT_EQ(*(odd_gpus | Selection::first("gpus")).base_ranks(r), (Ranks{0, 1, 3, 4, 5, 7}));
  EXPECT_EQ(*Selection::union_of(Selection::none(), Selection::first()).base_ranks(r), Ranks{0});
  EXPECT_EQ(*Selection::intersection_of(Selection::all(), Selection::none()).base_ranks(r),
            Ranks{});
  // SL-7: a union lists each rank once.
  EXPECT_EQ(*(odd_gpus | odd_gpus).ranks(r), (Ranks{1, 3, 5, 7}));
  EXPECT_EQ((odd_gpus & Selection::first("hosts")).to_string(),
            "(range(gpus, 1::2) & first(hosts))");
}

TEST(SelectionTest, CoordinatesAreTheRegions) {
  // On gpus 2..3 of host 1, first(gpus) is gpu 2 (base rank 6), and ranks() counts within.
  Region r = *hosts_gpus().select("hosts", Range{1})->select("gpus", Range{2});
  EXPECT_EQ(*Selection::first("gpus").base_ranks(r), Ranks{6});
  EXPECT_EQ(*Selection::first("gpus").ranks(r), Ranks{0});
  EXPECT_EQ(*Selection::range("gpus", {1}).base_ranks(r), Ranks{7});
  EXPECT_EQ(*Selection::first().base_ranks(Region()), Ranks{0});
}

TEST(SelectionTest, Errors) {
  // SL-7: a bad node fails the evaluation even where it could not change the result.
  Region r = hosts_gpus();
  auto unknown = (Selection::all() | Selection::first("cpus")).base_ranks(r);
  ASSERT_FALSE(unknown);
  EXPECT_TRUE(unknown.error().is(NdsliceErrc::kUnknownLabel));
  EXPECT_NE(unknown.error().message.find("'cpus'"), std::string::npos);
  EXPECT_TRUE((Selection::none() & Selection::range("cpus", {})).ranks(r).error().is(
      NdsliceErrc::kUnknownLabel));
  EXPECT_TRUE(Selection::range("gpus", {0, 4, 0}).ranks(r).error().is(NdsliceErrc::kBadStep));
  EXPECT_TRUE(Selection::range("gpus", {3, 0, -1}).ranks(r).error().is(NdsliceErrc::kBadStep));
}

// Brute force: the predicate of each node on a point's coordinates.
using Predicate = std::function<bool(const Point&)>;

std::pair<Selection, Predicate> random_selection(std::mt19937& rng, const Region& region,
                                                 int depth) {
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  int64_t kind = depth == 0 ? uniform(0, 3) : uniform(0, 5);
  if (kind >= 2 && kind <= 3 && region.ndim() == 0) kind = 0;
  switch (kind) {
    case 0: {
      bool all = uniform(0, 1) == 1;
      return {all ? Selection::all() : Selection::none(), [all](const Point&) { return all; }};
    }
    case 1:
      return {Selection::first(), [](const Point& p) { return p.rank() == 0; }};
    case 2: {
      size_t dim = static_cast<size_t>(uniform(0, static_cast<int64_t>(region.ndim()) - 1));
      return {Selection::first(region.labels()[dim]),
              [dim](const Point& p) { return p.coords()[dim] == 0; }};
    }
    case 3: {
      size_t dim = static_cast<size_t>(uniform(0, static_cast<int64_t>(region.ndim()) - 1));
      int64_t n = static_cast<int64_t>(region.sizes()[dim]);
      int64_t start = uniform(-6, 6), stop = uniform(-6, 6), step = uniform(1, 3);
      // Python's range(n)[start:stop:step] membership.
      auto norm = [n](int64_t x) { return std::clamp<int64_t>(x < 0 ? x + n : x, 0, n); };
      return {Selection::range(region.labels()[dim], {start, stop, step}),
              [=](const Point& p) {
                int64_t c = static_cast<int64_t>(p.coords()[dim]);
                return c >= norm(start) && c < norm(stop) && (c - norm(start)) % step == 0;
              }};
    }
    default: {
      auto [a, pa] = random_selection(rng, region, depth - 1);
      auto [b, pb] = random_selection(rng, region, depth - 1);
      if (kind == 4) return {a | b, [=](const Point& p) { return pa(p) || pb(p); }};
      return {a & b, [=](const Point& p) { return pa(p) && pb(p); }};
    }
  }
}

TEST(SelectionTest, RandomSelectionsMatchBruteForce) {
  // SL-7 on strided sub-regions of random root meshes.
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::string> labels;
    std::vector<size_t> sizes;
    size_t ndim = std::uniform_int_distribution<size_t>(1, 4)(rng);
    for (size_t i = 0; i < ndim; ++i) {
      labels.push_back("d" + std::to_string(i));
      sizes.push_back(std::uniform_int_distribution<size_t>(1, 5)(rng));
    }
    Region region(*Extent::make(labels, sizes));
    // A strided sub-region: odd or even indices of the first dimension when possible.
    auto sub = region.select("d0", (Range{std::uniform_int_distribution<int64_t>(0, 1)(rng),
                                         std::nullopt, 2}));
    if (sub) region = *sub;

    auto [selection, predicate] = random_selection(rng, region, 3);
    Ranks expected_ranks, expected_base;
    for (size_t rank = 0; rank < region.num_ranks(); ++rank) {
      if (predicate(*region.point_of(rank))) {
        expected_ranks.push_back(rank);
        expected_base.push_back(*region.base_rank(rank));
      }
    }
    SCOPED_TRACE(selection.to_string() + " on " + region.to_string());
    auto ranks = selection.ranks(region);
    ASSERT_TRUE(ranks) << ranks.error().to_string();
    EXPECT_EQ(*ranks, expected_ranks);
    EXPECT_EQ(*selection.base_ranks(region), expected_base);
  }
}

}  // namespace
}  // namespace podium::ndslice
