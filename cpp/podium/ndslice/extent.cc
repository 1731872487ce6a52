#include "podium/ndslice/extent.h"

#include <algorithm>

#include "podium/ndslice/errc.h"
#include "podium/ndslice/internal.h"
#include "podium/ndslice/point.h"

namespace podium::ndslice {

using internal::error;
using internal::format_labels;
using internal::format_sizes;
using internal::quoted;

Result<Extent> Extent::make(std::vector<std::string> labels, std::vector<size_t> sizes) {
  // SL-1
  if (labels.size() != sizes.size()) {
    return std::unexpected(error(NdsliceErrc::kBadShape,
                                 {"extent: ", std::to_string(labels.size()), " labels ",
                                  format_labels(labels), " but ", std::to_string(sizes.size()),
                                  " sizes ", format_sizes(sizes)}));
  }
  size_t num_ranks = 1;
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i].empty()) {
      return std::unexpected(error(NdsliceErrc::kBadShape,
                                   {"extent: empty label at position ", std::to_string(i)}));
    }
    if (std::find(labels.begin(), labels.begin() + i, labels[i]) != labels.begin() + i) {
      return std::unexpected(error(NdsliceErrc::kDuplicateLabel,
                                   {"extent: label ", quoted(labels[i]), " appears twice in ",
                                    format_labels(labels)}));
    }
    if (sizes[i] == 0) {
      return std::unexpected(error(NdsliceErrc::kBadShape,
                                   {"extent: dimension ", quoted(labels[i]), " has size 0"}));
    }
    if (__builtin_mul_overflow(num_ranks, sizes[i], &num_ranks)) {
      return std::unexpected(error(NdsliceErrc::kBadShape,
                                   {"extent: sizes ", format_sizes(sizes), " overflow size_t"}));
    }
  }
  Extent extent;
  extent.labels_ = std::move(labels);
  extent.sizes_ = std::move(sizes);
  extent.num_ranks_ = num_ranks;
  return extent;
}

std::optional<size_t> Extent::dim_of(std::string_view label) const {
  auto it = std::find(labels_.begin(), labels_.end(), label);
  if (it == labels_.end()) return std::nullopt;
  return static_cast<size_t>(it - labels_.begin());
}

Result<size_t> Extent::size(std::string_view label) const {
  auto dim = dim_of(label);
  if (!dim) {
    return std::unexpected(error(NdsliceErrc::kUnknownLabel,
                                 {"no dimension ", quoted(label), " in ", to_string()}));
  }
  return sizes_[*dim];
}

Result<Point> Extent::point_of_rank(size_t rank) const {
  if (rank >= num_ranks_) {
    return std::unexpected(error(NdsliceErrc::kOutOfRange,
                                 {"rank ", std::to_string(rank), " out of range for ", to_string(),
                                  " (valid 0..", std::to_string(num_ranks_ - 1), ")"}));
  }
  // SL-2: peel the row-major digits off from the last dimension.
  std::vector<size_t> coords(sizes_.size());
  size_t rest = rank;
  for (size_t i = sizes_.size(); i-- > 0;) {
    coords[i] = rest % sizes_[i];
    rest /= sizes_[i];
  }
  return Point(*this, std::move(coords), rank);
}

Result<size_t> Extent::rank_of(std::span<const size_t> coords) const {
  if (coords.size() != sizes_.size()) {
    return std::unexpected(error(NdsliceErrc::kBadShape,
                                 {"coordinates ", format_sizes(coords), " have ",
                                  std::to_string(coords.size()), " dimensions, ", to_string(),
                                  " has ", std::to_string(sizes_.size())}));
  }
  size_t rank = 0;
  for (size_t i = 0; i < coords.size(); ++i) {
    if (coords[i] >= sizes_[i]) {
      return std::unexpected(error(NdsliceErrc::kOutOfRange,
                                   {"coordinate ", std::to_string(coords[i]), " of ",
                                    quoted(labels_[i]), " out of range (valid 0..",
                                    std::to_string(sizes_[i] - 1), ")"}));
    }
    rank = rank * sizes_[i] + coords[i];
  }
  return rank;
}

std::string Extent::to_string() const {
  std::string out = "{";
  for (size_t i = 0; i < labels_.size(); ++i) {
    if (i > 0) out += ", ";
    out += quoted(labels_[i]);
    out += ": ";
    out += std::to_string(sizes_[i]);
  }
  return out + "}";
}

}  // namespace podium::ndslice
