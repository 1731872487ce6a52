// podium::ndslice::Extent — the named dimensions of a mesh and their sizes, in order:
// {'hosts': 2, 'gpus': 4}. An Extent says how big a mesh is, not where its ranks live (that
// is a Slice's job); a Region pairs the two.
//
// Invariants:
//   SL-1  labels are non-empty and unique; there is one size per label; every size is >= 1;
//         num_ranks() (the product of the sizes, 1 for no dimensions) fits in size_t.
//   SL-2  ranks are row-major: rank = sum_i coords[i] * prod_{j>i} sizes[j]. point_of_rank and
//         rank_of are inverse bijections between [0, num_ranks()) and the valid coordinates.
//
// Value type; immutable once made; safe to share between threads.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "podium/base/error.h"

namespace podium::ndslice {

class Point;  // point.h

class Extent {
 public:
  // No dimensions: one rank (a single process, a host mesh of this host).
  Extent() = default;

  // Checks SL-1: kBadShape (lengths differ, empty label, size 0, too many ranks),
  // kDuplicateLabel.
  [[nodiscard]] static Result<Extent> make(std::vector<std::string> labels,
                                           std::vector<size_t> sizes);

  const std::vector<std::string>& labels() const { return labels_; }
  const std::vector<size_t>& sizes() const { return sizes_; }
  size_t ndim() const { return labels_.size(); }
  size_t num_ranks() const { return num_ranks_; }

  // Position of `label` among the dimensions, or nullopt.
  std::optional<size_t> dim_of(std::string_view label) const;
  // kUnknownLabel names the label and the known ones.
  [[nodiscard]] Result<size_t> size(std::string_view label) const;

  // SL-2. kOutOfRange when rank >= num_ranks().
  [[nodiscard]] Result<Point> point_of_rank(size_t rank) const;
  // SL-2. kBadShape when coords.size() != ndim(), kOutOfRange when a coordinate is too big.
  [[nodiscard]] Result<size_t> rank_of(std::span<const size_t> coords) const;

  // {'hosts': 2, 'gpus': 4}
  std::string to_string() const;

  bool operator==(const Extent&) const = default;

 private:
  std::vector<std::string> labels_;
  std::vector<size_t> sizes_;
  size_t num_ranks_ = 1;
};

}  // namespace podium::ndslice
