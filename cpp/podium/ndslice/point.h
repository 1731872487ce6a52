// podium::ndslice::Point — one position in an Extent: its coordinates and its row-major rank.
// This is what ValueMesh.items() yields and what current_rank() returns in an actor.
//
// Invariant: a Point's coordinates are valid in its extent and rank() == extent().rank_of(
// coords()) (SL-2); make() and Extent::point_of_rank() are the only ways to build one.
//
// Value type; safe to share between threads.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "podium/base/error.h"
#include "podium/ndslice/extent.h"

namespace podium::ndslice {

class Point {
 public:
  // kBadShape / kOutOfRange as Extent::rank_of.
  [[nodiscard]] static Result<Point> make(Extent extent, std::vector<size_t> coords);

  const Extent& extent() const { return extent_; }
  const std::vector<size_t>& coords() const { return coords_; }
  size_t rank() const { return rank_; }
  size_t ndim() const { return coords_.size(); }

  // The coordinate along `label`; kUnknownLabel.
  [[nodiscard]] Result<size_t> get(std::string_view label) const;

  // Monarch's form, index/size per dimension: {'hosts': 0/2, 'gpus': 1/4}
  std::string to_string() const;

  bool operator==(const Point&) const = default;

 private:
  friend class Extent;
  Point(Extent extent, std::vector<size_t> coords, size_t rank)
      : extent_(std::move(extent)), coords_(std::move(coords)), rank_(rank) {}

  Extent extent_;
  std::vector<size_t> coords_;
  size_t rank_ = 0;
};

}  // namespace podium::ndslice
