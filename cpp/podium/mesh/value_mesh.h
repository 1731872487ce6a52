// podium::ValueMesh<T> — one value per rank of a mesh region, in rank order.
//
// What call() returns: values()[r] is the reply of the actor at rank r of the region the call
// was made on; item(point) and items() pair them with coordinates; slicing keeps the region
// and the values consistent.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "podium/base/error.h"
#include "podium/ndslice/point.h"
#include "podium/ndslice/region.h"

namespace podium {

template <class T>
class ValueMesh {
 public:
  ValueMesh() = default;
  // `values` are in the rank order of `extent` (one per rank).
  ValueMesh(ndslice::Extent extent, std::vector<T> values)
      : extent_(std::move(extent)), values_(std::move(values)) {}

  const ndslice::Extent& extent() const { return extent_; }
  size_t size() const { return values_.size(); }
  const std::vector<T>& values() const { return values_; }
  const T& operator[](size_t rank) const { return values_[rank]; }

  // The value at `point` (a point of this mesh's extent).
  [[nodiscard]] Result<T> item(const ndslice::Point& point) const {
    if (!(point.extent() == extent_)) {
      return std::unexpected(make_error(BaseErrc::kInvalidArgument,
                                        "point " + point.to_string() + " is not in extent " +
                                            extent_.to_string()));
    }
    return values_[point.rank()];
  }

  // (Point, value) pairs in rank order.
  std::vector<std::pair<ndslice::Point, T>> items() const {
    std::vector<std::pair<ndslice::Point, T>> out;
    out.reserve(values_.size());
    for (size_t r = 0; r < values_.size(); ++r) {
      out.emplace_back(*extent_.point_of_rank(r), values_[r]);
    }
    return out;
  }

  // The values of a sub-region (label = index removes the dimension).
  [[nodiscard]] Result<ValueMesh> slice(std::string_view label, int64_t index) const {
    ndslice::Region full(extent_);
    auto sub = full.select(label, index);
    if (!sub) return std::unexpected(sub.error());
    std::vector<T> vals;
    for (size_t base : sub->base_ranks()) vals.push_back(values_[base]);
    return ValueMesh(sub->extent(), std::move(vals));
  }

 private:
  ndslice::Extent extent_;
  std::vector<T> values_;
};

}  // namespace podium
