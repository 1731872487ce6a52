#include "podium/ndslice/slice.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "podium/ndslice/errc.h"
#include "podium/ndslice/extent.h"

namespace podium::ndslice {
namespace {

// Every coordinate tuple of `sizes` in row-major order.
std::vector<std::vector<size_t>> all_coords(const std::vector<size_t>& sizes) {
  std::vector<std::vector<size_t>> out;
  std::vector<size_t> c(sizes.size(), 0);
  while (true) {
    out.push_back(c);
    size_t i = sizes.size();
    while (i > 0 && ++c[i - 1] == sizes[i - 1]) c[--i] = 0;
    if (i == 0) return out;
  }
}

// Brute force: offset + sum c[i] * strides[i] for every c in row-major order.
std::vector<size_t> enumerate(const Slice& s) {
  std::vector<size_t> out;
  for (const auto& c : all_coords(s.sizes())) {
    size_t loc = s.offset();
    for (size_t i = 0; i < c.size(); ++i) loc += c[i] * s.strides()[i];
    out.push_back(loc);
  }
  return out;
}

std::vector<size_t> iterate(const Slice& s) {
  std::vector<size_t> out;
  for (size_t b : s) out.push_back(b);
  return out;
}

// Checks SL-4 and the index <-> location maps of a valid slice against brute force.
void check_against_brute_force(const Slice& s) {
  SCOPED_TRACE(s.to_string());
  std::vector<size_t> expected = enumerate(s);
  ASSERT_EQ(expected.size(), s.num_ranks());
  EXPECT_EQ(iterate(s), expected);  // SL-4 iteration order
  std::set<size_t> distinct(expected.begin(), expected.end());
  EXPECT_EQ(distinct.size(), expected.size());  // SL-3: injective
  auto coords = all_coords(s.sizes());
  // value() rather than *: an unexpected error fails the test instead of reading garbage.
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(s.location(coords[i]).value(), expected[i]);
    EXPECT_EQ(s.location_of_index(i).value(), expected[i]);
    EXPECT_EQ(s.index_of(expected[i]).value(), i);
    EXPECT_EQ(s.coordinates_of(expected[i]).value(), coords[i]);  // SL-4
  }
  size_t top = *std::max_element(expected.begin(), expected.end()) + 3;
  for (size_t b = 0; b <= top; ++b) {
    bool member = distinct.count(b) > 0;
    EXPECT_EQ(s.contains(b), member) << "base rank " << b;  // SL-4
    if (!member) {
      EXPECT_TRUE(s.coordinates_of(b).error().is(NdsliceErrc::kOutOfRange));
    }
  }
  EXPECT_TRUE(s.location_of_index(s.num_ranks()).error().is(NdsliceErrc::kOutOfRange));
  // flat_stride: the common difference when the locations are an arithmetic progression.
  bool arithmetic = true;
  for (size_t i = 2; i < expected.size(); ++i) {
    arithmetic &= expected[i] - expected[i - 1] == expected[1] - expected[0];
  }
  if (expected.size() > 1) arithmetic &= expected[1] > expected[0];
  EXPECT_EQ(s.flat_stride().has_value(), arithmetic);
  if (arithmetic && expected.size() > 1) {
    EXPECT_EQ(*s.flat_stride(), expected[1] - expected[0]);
  }
}

TEST(SliceTest, RowMajorOfExtent) {
  Slice s = Slice::row_major(*Extent::make({"hosts", "gpus"}, {2, 4}));
  EXPECT_EQ(s.offset(), 0u);
  EXPECT_EQ(s.strides(), (std::vector<size_t>{4, 1}));
  EXPECT_EQ(s.num_ranks(), 8u);
  EXPECT_TRUE(s.is_contiguous());
  EXPECT_EQ(iterate(s), (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(s.to_string(), "Slice{offset: 0, sizes: [2, 4], strides: [4, 1]}");
  check_against_brute_force(s);
}

TEST(SliceTest, NoDimensionsIsOneLocation) {
  Slice s = *Slice::make(7, {}, {});
  EXPECT_EQ(s.num_ranks(), 1u);
  EXPECT_EQ(iterate(s), (std::vector<size_t>{7}));
  EXPECT_EQ(*s.coordinates_of(7), (std::vector<size_t>{}));
  EXPECT_FALSE(s.contains(6));
  EXPECT_TRUE(s.is_contiguous());
  EXPECT_EQ(iterate(Slice()), (std::vector<size_t>{0}));
}

TEST(SliceTest, StridedAndColumnMajor) {
  // Columns 1 and 3 of a 4x4 mesh: evenly spaced, so one dimension of stride 2 holds them.
  Slice cols = *Slice::make(1, {4, 2}, {4, 2});
  EXPECT_EQ(iterate(cols), (std::vector<size_t>{1, 3, 5, 7, 9, 11, 13, 15}));
  EXPECT_EQ(cols.flat_stride(), 2u);
  EXPECT_FALSE(cols.is_contiguous());
  check_against_brute_force(cols);

  Slice block = *Slice::make(0, {2, 2}, {4, 1});
  EXPECT_EQ(iterate(block), (std::vector<size_t>{0, 1, 4, 5}));
  EXPECT_EQ(block.flat_stride(), std::nullopt);
  check_against_brute_force(block);

  // SL-3 does not require decreasing strides: column-major is nested too.
  Slice column_major = *Slice::make(0, {2, 3}, {1, 2});
  EXPECT_EQ(iterate(column_major), (std::vector<size_t>{0, 2, 4, 1, 3, 5}));
  check_against_brute_force(column_major);
}

TEST(SliceTest, MakeRejectsInvalid) {
  // SL-3
  EXPECT_TRUE(Slice::make(0, {2}, {1, 1}).error().is(NdsliceErrc::kBadShape));
  EXPECT_TRUE(Slice::make(0, {2, 0}, {2, 1}).error().is(NdsliceErrc::kBadShape));
  EXPECT_TRUE(Slice::make(0, {2, 2}, {1, 1}).error().is(NdsliceErrc::kBadLayout));  // equal
  EXPECT_TRUE(Slice::make(0, {2, 3}, {2, 1}).error().is(NdsliceErrc::kBadLayout));  // overlap
  EXPECT_TRUE(Slice::make(0, {2}, {0}).error().is(NdsliceErrc::kBadLayout));        // zero
  // Injective but not nested (0, 3, 2, 5, 4, 7): rejected, so coordinates_of stays greedy.
  EXPECT_TRUE(Slice::make(0, {3, 2}, {2, 3}).error().is(NdsliceErrc::kBadLayout));
  size_t huge = std::numeric_limits<size_t>::max() / 2;
  EXPECT_TRUE(Slice::make(huge, {2}, {huge + 2}).error().is(NdsliceErrc::kBadLayout));
  // A size-1 dimension's stride is never read, so anything goes there.
  EXPECT_TRUE(Slice::make(0, {1, 3}, {0, 1}));
  EXPECT_TRUE(Slice::make(0, {3, 1}, {1, std::numeric_limits<size_t>::max()}));
}

TEST(SliceTest, LocationRejectsBadCoordinates) {
  Slice s = *Slice::make(0, {2, 4}, {4, 1});
  std::vector<size_t> wrong_length{1};
  std::vector<size_t> too_big{2, 0};
  EXPECT_TRUE(s.location(wrong_length).error().is(NdsliceErrc::kBadShape));
  EXPECT_TRUE(s.location(too_big).error().is(NdsliceErrc::kOutOfRange));
}

TEST(SliceTest, RandomNestedSlicesMatchBruteForce) {
  // SL-3, SL-4: random nested layouts, with the stride order a random permutation.
  std::mt19937 rng(20240611);
  for (int trial = 0; trial < 300; ++trial) {
    size_t ndim = std::uniform_int_distribution<size_t>(0, 4)(rng);
    std::vector<size_t> sizes(ndim);
    for (auto& s : sizes) s = std::uniform_int_distribution<size_t>(1, 5)(rng);
    std::vector<size_t> order(ndim);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<size_t> strides(ndim);
    size_t reach = 0;
    for (size_t d : order) {
      strides[d] = reach + 1 + std::uniform_int_distribution<size_t>(0, 3)(rng);
      reach += strides[d] * (sizes[d] - 1);
    }
    size_t offset = std::uniform_int_distribution<size_t>(0, 10)(rng);
    auto s = Slice::make(offset, sizes, strides);
    ASSERT_TRUE(s) << s.error().to_string();
    check_against_brute_force(*s);
  }
}

TEST(SliceTest, RandomAcceptedSlicesAreInjective) {
  // SL-3: whatever make() accepts never maps two coordinates to one location.
  std::mt19937 rng(7);
  int accepted = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    size_t ndim = std::uniform_int_distribution<size_t>(1, 3)(rng);
    std::vector<size_t> sizes(ndim), strides(ndim);
    for (auto& s : sizes) s = std::uniform_int_distribution<size_t>(1, 4)(rng);
    for (auto& s : strides) s = std::uniform_int_distribution<size_t>(0, 12)(rng);
    auto s = Slice::make(0, sizes, strides);
    if (!s) {
      EXPECT_TRUE(s.error().is(NdsliceErrc::kBadLayout)) << s.error().to_string();
      continue;
    }
    ++accepted;
    check_against_brute_force(*s);
  }
  EXPECT_GT(accepted, 100);
}

}  // namespace
}  // namespace podium::ndslice
