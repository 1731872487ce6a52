// podium::ValueMesh<T> — one value per rank of a mesh region, in rank order.
//
// What call() returns: at(r) is the reply of the actor at rank r of the region the call was
// made on; item(point) and items() pair them with coordinates; slicing keeps the region and
// the values consistent. Values are held as runs of equal values (ME-9, cast.h): a call whose
// actors all answered alike is one value whatever the mesh's size, and costs O(runs) to build;
// values() and items() spell every rank out, on demand.
#pragma once

#include <algorithm>
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
  // Empty; append() adds the values of the next ranks.
  explicit ValueMesh(ndslice::Extent extent) : extent_(std::move(extent)) {}
  // `values` are in the rank order of `extent` (one per rank).
  ValueMesh(ndslice::Extent extent, std::vector<T> values) : extent_(std::move(extent)) {
    for (auto& v : values) append(1, std::move(v));
  }

  // The next `count` ranks all have `value`.
  void append(size_t count, T value) {
    if (count == 0) return;
    size_ += count;
    if constexpr (requires(const T& a, const T& b) { a == b; }) {
      if (!runs_.empty() && runs_.back() == value) {
        ends_.back() = size_;
        return;
      }
    }
    runs_.push_back(std::move(value));
    ends_.push_back(size_);
  }

  const ndslice::Extent& extent() const { return extent_; }
  size_t size() const { return size_; }
  // The value of rank `rank` (< size()); O(log runs).
  const T& at(size_t rank) const {
    auto it = std::upper_bound(ends_.begin(), ends_.end(), rank);
    return runs_[static_cast<size_t>(it - ends_.begin())];
  }
  const T& operator[](size_t rank) const { return at(rank); }
  // Runs of equal values: run i holds ranks [run_begin(i), run_end(i)).
  size_t runs() const { return runs_.size(); }
  size_t run_begin(size_t i) const { return i == 0 ? 0 : ends_[i - 1]; }
  size_t run_end(size_t i) const { return ends_[i]; }
  const T& run_value(size_t i) const { return runs_[i]; }

  // Every rank's value, in rank order; O(ranks).
  std::vector<T> values() const {
    std::vector<T> out;
    out.reserve(size_);
    for (size_t i = 0; i < runs_.size(); ++i) {
      out.insert(out.end(), run_end(i) - run_begin(i), runs_[i]);
    }
    return out;
  }

  // The value at `point` (a point of this mesh's extent).
  [[nodiscard]] Result<T> item(const ndslice::Point& point) const {
    if (!(point.extent() == extent_)) {
      return std::unexpected(make_error(BaseErrc::kInvalidArgument,
                                        "point " + point.to_string() + " is not in extent " +
                                            extent_.to_string()));
    }
    return at(point.rank());
  }

  // (Point, value) pairs in rank order.
  std::vector<std::pair<ndslice::Point, T>> items() const {
    std::vector<std::pair<ndslice::Point, T>> out;
    out.reserve(size_);
    for (size_t i = 0; i < runs_.size(); ++i) {
      for (size_t r = run_begin(i); r < run_end(i); ++r) {
        out.emplace_back(*extent_.point_of_rank(r), runs_[i]);
      }
    }
    return out;
  }

  // The values of a sub-region (label = index removes the dimension).
  [[nodiscard]] Result<ValueMesh> slice(std::string_view label, int64_t index) const {
    ndslice::Region full(extent_);
    auto sub = full.select(label, index);
    if (!sub) return std::unexpected(sub.error());
    ValueMesh out(sub->extent());
    for (size_t base : sub->base_ranks()) out.append(1, at(base));
    return out;
  }

 private:
  ndslice::Extent extent_;
  std::vector<T> runs_;
  std::vector<size_t> ends_;  // exclusive end rank of each run
  size_t size_ = 0;
};

}  // namespace podium
