#include "podium/ndslice/slice.h"

#include <algorithm>

#include "podium/ndslice/errc.h"
#include "podium/ndslice/extent.h"
#include "podium/ndslice/internal.h"

namespace podium::ndslice {

using internal::error;
using internal::format_sizes;

namespace {

// The dimensions of size > 1, finest (smallest stride) first.
std::vector<size_t> by_increasing_stride(const std::vector<size_t>& sizes,
                                         const std::vector<size_t>& strides) {
  std::vector<size_t> dims;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > 1) dims.push_back(i);
  }
  std::sort(dims.begin(), dims.end(), [&](size_t a, size_t b) { return strides[a] < strides[b]; });
  return dims;
}

}  // namespace

Result<Slice> Slice::make(size_t offset, std::vector<size_t> sizes, std::vector<size_t> strides) {
  auto describe = [&] {
    return "slice offset " + std::to_string(offset) + " sizes " + format_sizes(sizes) +
           " strides " + format_sizes(strides);
  };
  if (sizes.size() != strides.size()) {
    return std::unexpected(error(NdsliceErrc::kBadShape, {describe(), ": lengths differ"}));
  }
  size_t num_ranks = 1;
  size_t last = offset;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) {
      return std::unexpected(error(NdsliceErrc::kBadShape,
                                   {describe(), ": dimension ", std::to_string(i), " has size 0"}));
    }
    size_t reach = 0;
    if (__builtin_mul_overflow(num_ranks, sizes[i], &num_ranks) ||
        (sizes[i] > 1 && (__builtin_mul_overflow(strides[i], sizes[i] - 1, &reach) ||
                          __builtin_add_overflow(last, reach, &last)))) {
      return std::unexpected(error(NdsliceErrc::kBadLayout, {describe(), ": overflows size_t"}));
    }
  }
  // SL-3: cannot overflow, the sum is bounded by `last` checked above.
  size_t finer_reach = 0;
  for (size_t dim : by_increasing_stride(sizes, strides)) {
    if (strides[dim] <= finer_reach) {
      return std::unexpected(error(
          NdsliceErrc::kBadLayout,
          {describe(), ": stride of dimension ", std::to_string(dim),
           " does not exceed the reach of the finer dimensions (", std::to_string(finer_reach),
           "), so two coordinates would share a location"}));
    }
    finer_reach += strides[dim] * (sizes[dim] - 1);
  }
  Slice slice;
  slice.offset_ = offset;
  slice.sizes_ = std::move(sizes);
  slice.strides_ = std::move(strides);
  slice.num_ranks_ = num_ranks;
  return slice;
}

Slice Slice::row_major(const Extent& extent) {
  // Cannot overflow: the product of the sizes fits in size_t (SL-1).
  Slice slice;
  slice.sizes_ = extent.sizes();
  slice.strides_.resize(slice.sizes_.size());
  size_t stride = 1;
  for (size_t i = slice.sizes_.size(); i-- > 0;) {
    slice.strides_[i] = stride;
    stride *= slice.sizes_[i];
  }
  slice.num_ranks_ = extent.num_ranks();
  return slice;
}

Result<size_t> Slice::location(std::span<const size_t> coords) const {
  if (coords.size() != sizes_.size()) {
    return std::unexpected(error(NdsliceErrc::kBadShape,
                                 {"coordinates ", format_sizes(coords), " for ", to_string(),
                                  ": wrong number of dimensions"}));
  }
  size_t location = offset_;
  for (size_t i = 0; i < coords.size(); ++i) {
    if (coords[i] >= sizes_[i]) {
      return std::unexpected(error(NdsliceErrc::kOutOfRange,
                                   {"coordinates ", format_sizes(coords), " out of range for ",
                                    to_string()}));
    }
    location += coords[i] * strides_[i];
  }
  return location;
}

Result<std::vector<size_t>> Slice::coordinates_of(size_t base_rank) const {
  auto not_in_slice = [&] {
    return std::unexpected(error(NdsliceErrc::kOutOfRange, {"base rank ",
                                                            std::to_string(base_rank),
                                                            " is not in ", to_string()}));
  };
  if (base_rank < offset_) return not_in_slice();
  // SL-3 makes the greedy division exact: what the finer dimensions add up to is always
  // smaller than the stride of the coarser one.
  std::vector<size_t> coords(sizes_.size(), 0);
  size_t rest = base_rank - offset_;
  std::vector<size_t> dims = by_increasing_stride(sizes_, strides_);
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
    size_t c = rest / strides_[*it];
    if (c >= sizes_[*it]) return not_in_slice();
    coords[*it] = c;
    rest -= c * strides_[*it];
  }
  if (rest != 0) return not_in_slice();
  return coords;
}

bool Slice::contains(size_t base_rank) const { return coordinates_of(base_rank).has_value(); }

Result<size_t> Slice::location_of_index(size_t index) const {
  if (index >= num_ranks_) {
    return std::unexpected(error(NdsliceErrc::kOutOfRange,
                                 {"index ", std::to_string(index), " out of range for ",
                                  to_string(), " (valid 0..", std::to_string(num_ranks_ - 1),
                                  ")"}));
  }
  size_t location = offset_;
  for (size_t i = sizes_.size(); i-- > 0;) {
    location += (index % sizes_[i]) * strides_[i];
    index /= sizes_[i];
  }
  return location;
}

Result<size_t> Slice::index_of(size_t base_rank) const {
  auto coords = coordinates_of(base_rank);
  if (!coords) return std::unexpected(std::move(coords.error()));
  size_t index = 0;
  for (size_t i = 0; i < sizes_.size(); ++i) index = index * sizes_[i] + (*coords)[i];
  return index;
}

std::optional<size_t> Slice::flat_stride() const {
  // Row-major order steps by the finest stride until that dimension wraps; the wrap lands
  // one finest stride further only if the next coarser stride is exactly the span below it.
  std::optional<size_t> finest;
  size_t expected = 0;
  for (size_t i = sizes_.size(); i-- > 0;) {
    if (sizes_[i] == 1) continue;
    if (!finest) {
      finest = strides_[i];
    } else if (strides_[i] != expected) {
      return std::nullopt;
    }
    // An overflowing span matches no stride; 0 matches none either (SL-3: strides of
    // dimensions of size > 1 are >= 1).
    if (__builtin_mul_overflow(strides_[i], sizes_[i], &expected)) expected = 0;
  }
  return finest.value_or(1);
}

Slice::Iterator Slice::begin() const { return Iterator(this); }

Slice::Iterator::Iterator(const Slice* slice)
    : slice_(slice), coords_(slice->ndim(), 0), location_(slice->offset_), done_(false) {}

Slice::Iterator& Slice::Iterator::operator++() {
  // Odometer over the coordinates, last dimension fastest.
  for (size_t i = coords_.size(); i-- > 0;) {
    if (coords_[i] + 1 < slice_->sizes_[i]) {
      ++coords_[i];
      location_ += slice_->strides_[i];
      return *this;
    }
    location_ -= coords_[i] * slice_->strides_[i];
    coords_[i] = 0;
  }
  done_ = true;
  return *this;
}

std::string Slice::to_string() const {
  return "Slice{offset: " + std::to_string(offset_) + ", sizes: " + format_sizes(sizes_) +
         ", strides: " + format_sizes(strides_) + "}";
}

}  // namespace podium::ndslice
