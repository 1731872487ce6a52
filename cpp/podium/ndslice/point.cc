#include "podium/ndslice/point.h"

#include "podium/ndslice/errc.h"
#include "podium/ndslice/internal.h"

namespace podium::ndslice {

Result<Point> Point::make(Extent extent, std::vector<size_t> coords) {
  auto rank = extent.rank_of(coords);
  if (!rank) return std::unexpected(std::move(rank.error()));
  return Point(std::move(extent), std::move(coords), *rank);
}

Result<size_t> Point::get(std::string_view label) const {
  auto dim = extent_.dim_of(label);
  if (!dim) {
    return std::unexpected(internal::error(
        NdsliceErrc::kUnknownLabel, {"no dimension ", internal::quoted(label), " in point ",
                                     to_string()}));
  }
  return coords_[*dim];
}

std::string Point::to_string() const {
  std::string out = "{";
  for (size_t i = 0; i < coords_.size(); ++i) {
    if (i > 0) out += ", ";
    out += internal::quoted(extent_.labels()[i]);
    out += ": ";
    out += std::to_string(coords_[i]);
    out += '/';
    out += std::to_string(extent_.sizes()[i]);
  }
  return out + "}";
}

}  // namespace podium::ndslice
