#include "podium/ndslice/region.h"

#include "podium/ndslice/errc.h"
#include "podium/ndslice/internal.h"

namespace podium::ndslice {

using internal::error;
using internal::in_context;
using internal::quoted;

namespace {

Result<size_t> find_dim(const Extent& extent, std::string_view label, std::string_view op) {
  auto dim = extent.dim_of(label);
  if (!dim) {
    return std::unexpected(error(NdsliceErrc::kUnknownLabel,
                                 {op, ": no dimension ", quoted(label), " in ",
                                  extent.to_string()}));
  }
  return *dim;
}

template <class T>
std::vector<T> erase_at(std::vector<T> v, size_t i) {
  v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
  return v;
}

// A derived region. The operations keep SL-3 and SL-5 by construction; making it through the
// checked constructors anyway keeps a mistake here from producing an invalid region.
Result<Region> derive(std::string_view op, std::vector<std::string> labels, size_t offset,
                      std::vector<size_t> sizes, std::vector<size_t> strides) {
  auto slice = Slice::make(offset, std::move(sizes), std::move(strides));
  if (!slice) return std::unexpected(in_context(op, std::move(slice.error())));
  auto region = Region::make(std::move(labels), std::move(*slice));
  if (!region) return std::unexpected(in_context(op, std::move(region.error())));
  return region;
}

}  // namespace

Result<Region> Region::make(std::vector<std::string> labels, Slice slice) {
  auto extent = Extent::make(std::move(labels), slice.sizes());
  if (!extent) return std::unexpected(std::move(extent.error()));
  return Region(std::move(*extent), std::move(slice));
}

Result<Region> Region::select(std::string_view label, int64_t index) const {
  std::string op = "select " + std::string(label) + "=" + std::to_string(index);
  auto dim = find_dim(extent_, label, op);
  if (!dim) return std::unexpected(std::move(dim.error()));
  size_t size = sizes()[*dim];
  // Python indexing: -size..size-1, negative counts from the end. Unsigned arithmetic keeps
  // every int64_t away from overflow.
  size_t magnitude = index < 0 ? -static_cast<uint64_t>(index) : static_cast<uint64_t>(index);
  if ((index >= 0 && magnitude >= size) || (index < 0 && magnitude > size)) {
    return std::unexpected(error(NdsliceErrc::kOutOfRange,
                                 {op, ": index out of range for dimension ", quoted(label),
                                  " of size ", std::to_string(size), " (valid -",
                                  std::to_string(size), "..", std::to_string(size - 1), ")"}));
  }
  size_t i = index >= 0 ? magnitude : size - magnitude;
  return derive(op, erase_at(labels(), *dim), slice_.offset() + i * slice_.strides()[*dim],
                erase_at(sizes(), *dim), erase_at(slice_.strides(), *dim));
}

Result<Region> Region::select(std::string_view label, const Range& range) const {
  std::string op = "select " + std::string(label) + "=" + range.to_string();
  auto dim = find_dim(extent_, label, op);
  if (!dim) return std::unexpected(std::move(dim.error()));
  auto indices = range.resolve(sizes()[*dim]);
  if (!indices) return std::unexpected(in_context(op, std::move(indices.error())));
  if (indices->count == 0) {
    return std::unexpected(error(NdsliceErrc::kOutOfRange,
                                 {op, ": range picks no index of dimension ", quoted(label),
                                  " of size ", std::to_string(sizes()[*dim])}));
  }
  std::vector<size_t> new_sizes = sizes();
  std::vector<size_t> strides = slice_.strides();
  size_t offset = slice_.offset() + indices->start * strides[*dim];
  new_sizes[*dim] = indices->count;
  // With one index left the stride is never read (SL-3), and stride * step could overflow.
  if (indices->count > 1) strides[*dim] *= indices->step;
  return derive(op, labels(), offset, std::move(new_sizes), std::move(strides));
}

Result<Region> Region::split(std::string_view label, std::vector<std::string> new_labels,
                             std::vector<int64_t> sizes) const {
  std::string op = "split " + quoted(label);
  auto dim = find_dim(extent_, label, op);
  if (!dim) return std::unexpected(std::move(dim.error()));
  size_t size = extent_.sizes()[*dim];
  if (new_labels.empty() || new_labels.size() != sizes.size()) {
    return std::unexpected(error(NdsliceErrc::kBadShape,
                                 {op, ": ", std::to_string(new_labels.size()), " labels but ",
                                  std::to_string(sizes.size()), " sizes"}));
  }
  auto bad_sizes = [&](std::string_view why) {
    std::string listed;
    for (int64_t s : sizes) listed += (listed.empty() ? "" : ", ") + std::to_string(s);
    return std::unexpected(error(NdsliceErrc::kBadShape,
                                 {op, " of size ", std::to_string(size), " into [", listed,
                                  "]: ", why}));
  };
  std::optional<size_t> inferred;
  size_t known = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == -1 && !inferred) {
      inferred = i;
    } else if (sizes[i] < 1) {
      return bad_sizes("sizes must be >= 1, with at most one -1");
    } else if (__builtin_mul_overflow(known, static_cast<size_t>(sizes[i]), &known) ||
               known > size) {
      return bad_sizes("the product exceeds the size");
    }
  }
  if (inferred ? size % known != 0 : known != size) {
    return bad_sizes("the product does not match the size");
  }
  std::vector<size_t> split_sizes(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    split_sizes[i] = i == inferred ? size / known : static_cast<size_t>(sizes[i]);
  }
  // Row-major inside the split dimension, scaled by its stride. The last product may wrap
  // (unsigned) only when every dimension left of it has size 1; those strides are never read.
  std::vector<size_t> split_strides(split_sizes.size());
  size_t running = slice_.strides()[*dim];
  for (size_t i = split_sizes.size(); i-- > 0;) {
    split_strides[i] = running;
    running *= split_sizes[i];
  }

  auto splice = [&]<class T>(const std::vector<T>& v, std::vector<T> middle) {
    std::vector<T> out(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(*dim));
    out.insert(out.end(), std::make_move_iterator(middle.begin()),
               std::make_move_iterator(middle.end()));
    out.insert(out.end(), v.begin() + static_cast<std::ptrdiff_t>(*dim) + 1, v.end());
    return out;
  };
  return derive(op, splice(labels(), std::move(new_labels)), slice_.offset(),
                splice(extent_.sizes(), std::move(split_sizes)),
                splice(slice_.strides(), std::move(split_strides)));
}

Result<Region> Region::flatten(std::string label) const {
  std::string op = "flatten to " + quoted(label);
  auto stride = slice_.flat_stride();
  if (!stride) {
    return std::unexpected(error(NdsliceErrc::kNotFlattenable,
                                 {op, ": the base ranks of ", to_string(),
                                  " are not evenly spaced, so no single dimension holds them"}));
  }
  return derive(op, {std::move(label)}, slice_.offset(), {num_ranks()}, {*stride});
}

Result<Region> Region::rename(std::string_view from, std::string to) const {
  std::string op = "rename " + quoted(from) + " to " + quoted(to);
  auto dim = find_dim(extent_, from, op);
  if (!dim) return std::unexpected(std::move(dim.error()));
  std::vector<std::string> new_labels = labels();
  new_labels[*dim] = std::move(to);
  auto region = Region::make(std::move(new_labels), slice_);
  if (!region) return std::unexpected(in_context(op, std::move(region.error())));
  return region;
}

Result<size_t> Region::rank_of_point(const Point& point) const {
  if (point.extent() != extent_) {
    return std::unexpected(error(NdsliceErrc::kBadShape,
                                 {"point ", point.to_string(), " is not a point of ",
                                  extent_.to_string()}));
  }
  return point.rank();
}

std::vector<size_t> Region::base_ranks() const {
  std::vector<size_t> out;
  out.reserve(num_ranks());
  for (size_t base_rank : slice_) out.push_back(base_rank);
  return out;
}

std::string Region::to_string() const { return extent_.to_string() + " at " + slice_.to_string(); }

}  // namespace podium::ndslice
