// podium::ndslice::Slice — where an n-dimensional block of ranks lives in the flat rank space
// of the root mesh (its "base ranks"): the point with coordinates c sits at base rank
//   location(c) = offset + sum_i c[i] * strides[i].
// Slicing a mesh never copies rank lists: it derives a new (offset, sizes, strides).
//
// Invariants:
//   SL-3  every size is >= 1; the largest location fits in size_t; the strides are nested:
//         taking the dimensions of size > 1 by increasing stride, each stride exceeds the
//         largest offset that the finer ones reach, sum_j strides[j] * (sizes[j] - 1). So no
//         two coordinates share a location. Strides of size-1 dimensions are never read.
//   SL-4  coordinates_of(location(c)) == c for every valid c, and contains(b) holds exactly
//         when coordinates_of(b) succeeds. Iteration visits the locations in row-major order
//         of the coordinates: the i-th is location_of_index(i).
//
// Value type; immutable once made; safe to share between threads. An Iterator borrows its
// Slice, which must outlive it.
#pragma once

#include <cstddef>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "podium/base/error.h"

namespace podium::ndslice {

class Extent;

class Slice {
 public:
  class Iterator;

  // No dimensions: the single base rank 0.
  Slice() = default;

  // Checks SL-3: kBadShape (lengths differ, size 0), kBadLayout (overlap, overflow).
  [[nodiscard]] static Result<Slice> make(size_t offset, std::vector<size_t> sizes,
                                          std::vector<size_t> strides);
  // The dense row-major layout of `extent` at offset 0: a root mesh.
  static Slice row_major(const Extent& extent);

  size_t offset() const { return offset_; }
  const std::vector<size_t>& sizes() const { return sizes_; }
  const std::vector<size_t>& strides() const { return strides_; }
  size_t ndim() const { return sizes_.size(); }
  size_t num_ranks() const { return num_ranks_; }

  // Base rank of `coords`; kBadShape (wrong length), kOutOfRange.
  [[nodiscard]] Result<size_t> location(std::span<const size_t> coords) const;
  // SL-4. kOutOfRange when `base_rank` is not in the slice.
  [[nodiscard]] Result<std::vector<size_t>> coordinates_of(size_t base_rank) const;
  bool contains(size_t base_rank) const;

  // The base rank of the index-th coordinates in row-major order; kOutOfRange.
  [[nodiscard]] Result<size_t> location_of_index(size_t index) const;
  // Inverse of location_of_index; kOutOfRange when `base_rank` is not in the slice.
  [[nodiscard]] Result<size_t> index_of(size_t base_rank) const;

  // The distance between consecutive locations when it is the same everywhere (1 for a
  // single rank), which is when one dimension can describe the slice; else nullopt.
  std::optional<size_t> flat_stride() const;
  // The locations are offset, offset + 1, ..., offset + num_ranks() - 1, in order.
  bool is_contiguous() const { return flat_stride() == 1; }

  Iterator begin() const;
  std::default_sentinel_t end() const { return {}; }

  // Slice{offset: 0, sizes: [2, 4], strides: [4, 1]}
  std::string to_string() const;

  bool operator==(const Slice&) const = default;

 private:
  size_t offset_ = 0;
  std::vector<size_t> sizes_;
  std::vector<size_t> strides_;
  size_t num_ranks_ = 1;
};

// Visits the base ranks of a Slice in row-major order (SL-4).
class Slice::Iterator {
 public:
  using value_type = size_t;
  using difference_type = std::ptrdiff_t;

  Iterator() = default;

  size_t operator*() const { return location_; }
  Iterator& operator++();
  void operator++(int) { ++*this; }
  bool operator==(std::default_sentinel_t) const { return done_; }

 private:
  friend class Slice;
  explicit Iterator(const Slice* slice);

  const Slice* slice_ = nullptr;
  std::vector<size_t> coords_;
  size_t location_ = 0;
  bool done_ = true;
};

}  // namespace podium::ndslice
