// Property tests for Region: random root meshes, random chains of operations, each result
// checked against a brute-force model that applies the same operation to the explicit array
// of base ranks (NumPy semantics, SL-6).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "podium/ndslice/codec.h"
#include "podium/ndslice/errc.h"
#include "podium/ndslice/region.h"

namespace podium::ndslice {
namespace {

// An n-dimensional array of base ranks, row-major.
struct Model {
  std::vector<std::string> labels;
  std::vector<size_t> sizes;
  std::vector<size_t> data;
};

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

size_t flat_index(const std::vector<size_t>& sizes, const std::vector<size_t>& c) {
  size_t index = 0;
  for (size_t i = 0; i < sizes.size(); ++i) index = index * sizes[i] + c[i];
  return index;
}

// a[..., picks, ...] along `dim`; with `keep_dim` false, picks has one element and the axis
// goes away.
Model take(const Model& m, size_t dim, const std::vector<size_t>& picks, bool keep_dim) {
  Model out = m;
  out.sizes[dim] = picks.size();
  out.data.clear();
  for (auto c : all_coords(out.sizes)) {
    c[dim] = picks[c[dim]];
    out.data.push_back(m.data[flat_index(m.sizes, c)]);
  }
  if (!keep_dim) {
    out.labels.erase(out.labels.begin() + static_cast<std::ptrdiff_t>(dim));
    out.sizes.erase(out.sizes.begin() + static_cast<std::ptrdiff_t>(dim));
  }
  return out;
}

// range(n)[start:stop:step] in Python, written from the language reference.
std::vector<size_t> python_slice(size_t n, std::optional<int64_t> start,
                                 std::optional<int64_t> stop, int64_t step) {
  auto norm = [&](std::optional<int64_t> v, int64_t dflt) {
    int64_t x = v.value_or(dflt);
    if (x < 0) x += static_cast<int64_t>(n);
    return std::clamp<int64_t>(x, 0, static_cast<int64_t>(n));
  };
  std::vector<size_t> out;
  for (int64_t i = norm(start, 0); i < norm(stop, static_cast<int64_t>(n)); i += step) {
    out.push_back(static_cast<size_t>(i));
  }
  return out;
}

bool evenly_spaced(const std::vector<size_t>& v) {
  for (size_t i = 2; i < v.size(); ++i) {
    if (v[i] - v[i - 1] != v[1] - v[0]) return false;
  }
  return v.size() < 2 || v[1] > v[0];
}

void check_matches(const Region& r, const Model& m, size_t root_ranks) {
  SCOPED_TRACE(r.to_string());
  ASSERT_EQ(r.labels(), m.labels);
  ASSERT_EQ(r.sizes(), m.sizes);
  ASSERT_EQ(r.num_ranks(), m.data.size());
  EXPECT_EQ(r.base_ranks(), m.data);  // SL-6
  std::vector<size_t> iterated;
  for (size_t b : r.slice()) iterated.push_back(b);
  EXPECT_EQ(iterated, m.data);  // SL-4
  auto coords = all_coords(m.sizes);
  // value() rather than *: an unexpected error fails the test instead of reading garbage.
  for (size_t rank = 0; rank < m.data.size(); ++rank) {
    EXPECT_EQ(r.base_rank(rank).value(), m.data[rank]);
    EXPECT_EQ(r.rank_of_base(m.data[rank]).value(), rank);
    auto p = r.point_of(rank);  // SL-2
    ASSERT_TRUE(p);
    EXPECT_EQ(p->coords(), coords[rank]);
    EXPECT_EQ(r.rank_of_point(*p).value(), rank);
    EXPECT_EQ(r.slice().location(coords[rank]).value(), m.data[rank]);
    EXPECT_EQ(r.slice().coordinates_of(m.data[rank]).value(), coords[rank]);  // SL-4
  }
  std::set<size_t> members(m.data.begin(), m.data.end());
  for (size_t b = 0; b < root_ranks; ++b) EXPECT_EQ(r.slice().contains(b), members.count(b) > 0);
  auto decoded = decode<Region>(encode(r));  // SL-8
  ASSERT_TRUE(decoded) << decoded.error().to_string();
  EXPECT_EQ(*decoded, r);
}

TEST(RegionPropertyTest, RandomOperationChainsMatchBruteForce) {
  std::mt19937 rng(0x5eed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto pick = [&](size_t count) {  // an index into a container of `count` elements
    return static_cast<size_t>(uniform(0, static_cast<int64_t>(count) - 1));
  };
  int fresh = 0;
  auto fresh_label = [&] { return "n" + std::to_string(fresh++); };
  int succeeded = 0, failed = 0;

  for (int trial = 0; trial < 400; ++trial) {
    Model m;
    size_t ndim = static_cast<size_t>(uniform(1, 4));
    for (size_t i = 0; i < ndim; ++i) {
      m.labels.push_back("d" + std::to_string(i));
      m.sizes.push_back(static_cast<size_t>(uniform(1, 5)));
    }
    Region r(*Extent::make(m.labels, m.sizes));
    size_t root_ranks = r.num_ranks();
    for (size_t b = 0; b < root_ranks; ++b) m.data.push_back(b);
    check_matches(r, m, root_ranks);

    for (int step = 0; step < 8; ++step) {
      if (m.labels.empty()) break;
      size_t dim = pick(m.labels.size());
      const std::string label = m.labels[dim];
      const size_t n = m.sizes[dim];
      Result<Region> next = std::unexpected(Error{});
      std::optional<Model> expected;  // nullopt: the operation must fail with `expect_error`
      NdsliceErrc expect_error = NdsliceErrc::kOutOfRange;

      switch (uniform(0, 6)) {
        case 0: {  // select an index, sometimes out of range
          int64_t index = uniform(-static_cast<int64_t>(n) - 1, static_cast<int64_t>(n));
          next = r.select(label, index);
          if (index >= -static_cast<int64_t>(n) && index < static_cast<int64_t>(n)) {
            size_t i = index < 0 ? static_cast<size_t>(index + static_cast<int64_t>(n))
                                 : static_cast<size_t>(index);
            expected = take(m, dim, {i}, false);
          }
          break;
        }
        case 1:
        case 2: {  // select a range; an empty one fails, a zero step fails
          auto bound = [&]() -> std::optional<int64_t> {
            return uniform(0, 4) == 0 ? std::nullopt : std::optional<int64_t>(uniform(-6, 6));
          };
          Range range{bound(), bound(), uniform(0, 12) == 0 ? 0 : uniform(1, 3)};
          next = r.select(label, range);
          if (range.step == 0) {
            expect_error = NdsliceErrc::kBadStep;
          } else {
            auto picks = python_slice(n, range.start, range.stop, range.step);
            if (!picks.empty()) expected = take(m, dim, picks, true);
          }
          break;
        }
        case 3: {  // split into (a, n / a), sometimes inferring one side
          std::vector<int64_t> divisors;
          for (size_t a = 1; a <= n; ++a) {
            if (n % a == 0) divisors.push_back(static_cast<int64_t>(a));
          }
          int64_t a = divisors[pick(divisors.size())];
          int64_t b = static_cast<int64_t>(n) / a;
          std::vector<int64_t> sizes{a, b};
          if (uniform(0, 2) == 0) sizes[pick(2)] = -1;
          std::string l1 = fresh_label(), l2 = fresh_label();
          next = r.split(label, {l1, l2}, sizes);
          Model e = m;
          e.labels.erase(e.labels.begin() + static_cast<std::ptrdiff_t>(dim));
          e.labels.insert(e.labels.begin() + static_cast<std::ptrdiff_t>(dim), {l1, l2});
          e.sizes.erase(e.sizes.begin() + static_cast<std::ptrdiff_t>(dim));
          e.sizes.insert(e.sizes.begin() + static_cast<std::ptrdiff_t>(dim),
                         {static_cast<size_t>(a), static_cast<size_t>(b)});
          expected = e;
          break;
        }
        case 4: {  // flatten: possible exactly when the base ranks are evenly spaced
          std::string l = fresh_label();
          next = r.flatten(l);
          if (evenly_spaced(m.data)) {
            expected = Model{{l}, {m.data.size()}, m.data};
          } else {
            expect_error = NdsliceErrc::kNotFlattenable;
          }
          break;
        }
        case 5: {  // rename
          std::string l = fresh_label();
          next = r.rename(label, l);
          expected = m;
          expected->labels[dim] = l;
          break;
        }
        case 6: {  // an unknown label fails every operation
          next = uniform(0, 1) ? r.select("unknown", 0) : r.split("unknown", {"x"}, {1});
          expect_error = NdsliceErrc::kUnknownLabel;
          break;
        }
      }

      if (!expected) {
        ASSERT_FALSE(next) << "expected an error, got " << next->to_string();
        EXPECT_TRUE(next.error().is(expect_error)) << next.error().to_string();
        ++failed;
        continue;
      }
      ASSERT_TRUE(next) << next.error().to_string();
      ++succeeded;
      r = std::move(*next);
      m = std::move(*expected);
      check_matches(r, m, root_ranks);
    }
  }
  // The chains exercise both outcomes a fair number of times.
  EXPECT_GT(succeeded, 1000);
  EXPECT_GT(failed, 200);
}

}  // namespace
}  // namespace podium::ndslice
