// podium::ndslice::Region — a named view of some ranks of a root mesh: labels over a Slice.
// Every mesh handle holds one; podium.Shape in Python. Slicing a mesh is an operation here:
// each returns a new Region and leaves this one unchanged.
//
// A Region has ranks 0..num_ranks()-1 in row-major order of its own coordinates (SL-2); rank r
// lives at base rank base_rank(r) = slice().location(point_of(r).coords()) of the root mesh.
//
// Invariants:
//   SL-5  extent() satisfies SL-1, slice() satisfies SL-3, and extent().sizes() ==
//         slice().sizes(): dimension i of the extent is dimension i of the slice.
//   SL-6  every operation returns the ranks that the same operation gives on the array of
//         this region's base ranks (NumPy semantics): select(label, i) is a[..., i, ...],
//         select(label, range) is a[..., start:stop:step, ...], split is a reshape of one
//         axis, flatten is a.reshape(-1), rename keeps the array. Order is preserved.
//
// Value type; safe to share between threads. Errors name the operation, the label and the
// valid range.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "podium/base/error.h"
#include "podium/ndslice/extent.h"
#include "podium/ndslice/point.h"
#include "podium/ndslice/range.h"
#include "podium/ndslice/slice.h"

namespace podium::ndslice {

class Region {
 public:
  // No dimensions: the single base rank 0.
  Region() = default;
  // The whole root mesh of `extent`: base rank == rank.
  explicit Region(Extent extent)
      : extent_(std::move(extent)), slice_(Slice::row_major(extent_)) {}

  // Checks SL-5 (one label per slice dimension) and SL-1.
  [[nodiscard]] static Result<Region> make(std::vector<std::string> labels, Slice slice);

  const Extent& extent() const { return extent_; }
  const Slice& slice() const { return slice_; }
  const std::vector<std::string>& labels() const { return extent_.labels(); }
  const std::vector<size_t>& sizes() const { return extent_.sizes(); }
  size_t ndim() const { return extent_.ndim(); }
  size_t num_ranks() const { return extent_.num_ranks(); }
  [[nodiscard]] Result<size_t> size(std::string_view label) const { return extent_.size(label); }

  // Keeps index `index` of `label` and removes the dimension (mesh.slice(gpus=2)). A
  // negative index counts from the end, as in Python. kUnknownLabel, kOutOfRange.
  [[nodiscard]] Result<Region> select(std::string_view label, int64_t index) const;
  // Keeps the dimension with the indices `range` picks (mesh.slice(gpus=slice(0, 4))).
  // kUnknownLabel, kBadStep, kOutOfRange when the range picks nothing.
  [[nodiscard]] Result<Region> select(std::string_view label, const Range& range) const;
  // Replaces `label` by `new_labels` with `sizes` (row-major), whose product must be the
  // size of `label`; one size may be -1 to infer it. kUnknownLabel, kBadShape,
  // kDuplicateLabel.
  [[nodiscard]] Result<Region> split(std::string_view label, std::vector<std::string> new_labels,
                                     std::vector<int64_t> sizes) const;
  // All dimensions into one named `label`, same base ranks in the same order.
  // kNotFlattenable when the base ranks are not evenly spaced (see Slice::flat_stride).
  [[nodiscard]] Result<Region> flatten(std::string label) const;
  // kUnknownLabel, kDuplicateLabel (`to` names another dimension), kBadShape (empty).
  [[nodiscard]] Result<Region> rename(std::string_view from, std::string to) const;

  // SL-2 within the region. kOutOfRange.
  [[nodiscard]] Result<Point> point_of(size_t rank) const { return extent_.point_of_rank(rank); }
  // kBadShape when `point` belongs to another extent.
  [[nodiscard]] Result<size_t> rank_of_point(const Point& point) const;
  // The base rank (rank in the root mesh) of `rank`; kOutOfRange.
  [[nodiscard]] Result<size_t> base_rank(size_t rank) const {
    return slice_.location_of_index(rank);
  }
  // The rank of `base_rank` in this region; kOutOfRange when it is not in the region.
  [[nodiscard]] Result<size_t> rank_of_base(size_t base_rank) const {
    return slice_.index_of(base_rank);
  }
  // base_rank(r) for r = 0..num_ranks()-1.
  std::vector<size_t> base_ranks() const;

  // {'hosts': 2, 'gpus': 4} at Slice{offset: 0, sizes: [2, 4], strides: [4, 1]}
  std::string to_string() const;

  bool operator==(const Region&) const = default;

 private:
  Region(Extent extent, Slice slice) : extent_(std::move(extent)), slice_(std::move(slice)) {}

  Extent extent_;
  Slice slice_;
};

}  // namespace podium::ndslice
