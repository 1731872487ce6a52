#include "podium/ndslice/range.h"

#include <gtest/gtest.h>

#include "podium/ndslice/errc.h"

namespace podium::ndslice {
namespace {

std::vector<size_t> indices_of(const Range::Indices& r) {
  std::vector<size_t> out;
  for (size_t k = 0; k < r.count; ++k) out.push_back(r.start + k * r.step);
  return out;
}

TEST(RangeTest, MatchesPythonSliceIndices) {
  // Expected values computed with CPython: list(range(size)[slice(start, stop, step)]).
  struct Case {
    size_t size;
    Range range;
    std::vector<size_t> expected;
  };
  const std::vector<Case> cases = {
      {5, {std::nullopt, std::nullopt, 1}, {0, 1, 2, 3, 4}},
      {5, {std::nullopt, std::nullopt, 2}, {0, 2, 4}},
      {5, {-3, std::nullopt, 1}, {2, 3, 4}},
      {5, {std::nullopt, -1, 1}, {0, 1, 2, 3}},
      {5, {1, std::nullopt, 3}, {1, 4}},
      {4, {-1, std::nullopt, 1}, {3}},
      {4, {-4, std::nullopt, 2}, {0, 2}},
      {4, {-5, 3, 1}, {0, 1, 2}},
      {4, {2, 100, 1}, {2, 3}},
      {4, {-100, -2, 1}, {0, 1}},
      {4, {3, 1, 1}, {}},
      {4, {0, 4, 4}, {0}},
      {6, {1, 6, 2}, {1, 3, 5}},
      {6, {-5, -1, 2}, {1, 3}},
      {5, {9, std::nullopt, 1}, {}},
      {5, {2, 2, 1}, {}},
      {1, {std::nullopt, std::nullopt, 5}, {0}},
      {5, {-9, -1, 3}, {0, 3}},
      {4, {-3, 7, 3}, {1}},
      {5, {1, -1, 3}, {1}},
      {2, {std::nullopt, 7, 2}, {0}},
      {5, {-1, 7, 1}, {4}},
      {4, {3, -6, 1}, {}},
      {1, {9, -1, 1}, {}},
  };
  for (const Case& c : cases) {
    auto r = c.range.resolve(c.size);
    ASSERT_TRUE(r) << r.error().to_string();
    EXPECT_EQ(indices_of(*r), c.expected) << "size " << c.size << " range " << c.range.to_string();
  }
}

TEST(RangeTest, ExtremeBoundsDoNotOverflow) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(indices_of(*(Range{kMin, kMax, 1}).resolve(3)), (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(indices_of(*(Range{kMin, kMax, kMax}).resolve(3)), (std::vector<size_t>{0}));
  EXPECT_EQ(indices_of(*(Range{kMax, kMin, 1}).resolve(3)), (std::vector<size_t>{}));
}

TEST(RangeTest, RejectsNonPositiveStep) {
  EXPECT_TRUE((Range{0, 4, 0}).resolve(4).error().is(NdsliceErrc::kBadStep));
  EXPECT_TRUE((Range{3, 0, -1}).resolve(4).error().is(NdsliceErrc::kBadStep));
}

TEST(RangeTest, ToStringIsPythonNotation) {
  EXPECT_EQ(Range{}.to_string(), ":");
  EXPECT_EQ((Range{1, std::nullopt}).to_string(), "1:");
  EXPECT_EQ((Range{std::nullopt, -1}).to_string(), ":-1");
  EXPECT_EQ((Range{0, 8, 2}).to_string(), "0:8:2");
}

}  // namespace
}  // namespace podium::ndslice
