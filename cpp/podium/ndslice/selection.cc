#include "podium/ndslice/selection.h"

#include <optional>

#include "podium/ndslice/errc.h"
#include "podium/ndslice/internal.h"
#include "podium/ndslice/region.h"

namespace podium::ndslice {

struct Selection::Node {
  enum class Kind { kAll, kNone, kFirst, kRange, kUnion, kIntersection };
  Kind kind = Kind::kAll;
  std::optional<std::string> label;  // kFirst (absent: rank 0 of the region), kRange
  Range range;                       // kRange
  std::shared_ptr<const Node> lhs;   // kUnion, kIntersection
  std::shared_ptr<const Node> rhs;
};

namespace {

using Mask = std::vector<char>;

// The ranks of `region` whose coordinate c along dimension `dim` has picked[c] set.
Mask along(const Region& region, size_t dim, const std::vector<char>& picked) {
  // SL-2: the coordinate along dim is (rank / inner) % size.
  size_t inner = 1;
  for (size_t i = dim + 1; i < region.ndim(); ++i) inner *= region.sizes()[i];
  Mask mask(region.num_ranks());
  for (size_t rank = 0; rank < mask.size(); ++rank) {
    mask[rank] = picked[(rank / inner) % picked.size()];
  }
  return mask;
}

}  // namespace

Result<std::vector<char>> Selection::mask_of(const Node& node, const Region& region) {
  using Kind = Node::Kind;
  switch (node.kind) {
    case Kind::kAll:
      return Mask(region.num_ranks(), 1);
    case Kind::kNone:
      return Mask(region.num_ranks(), 0);
    case Kind::kFirst:
    case Kind::kRange: {
      if (!node.label) {
        Mask mask(region.num_ranks(), 0);
        mask[0] = 1;  // a region has at least one rank (SL-1)
        return mask;
      }
      auto dim = region.extent().dim_of(*node.label);
      if (!dim) {
        return std::unexpected(internal::error(
            NdsliceErrc::kUnknownLabel, {"selection ", to_string_of(node), ": no dimension ",
                                         internal::quoted(*node.label), " in ",
                                         region.extent().to_string()}));
      }
      std::vector<char> picked(region.sizes()[*dim], 0);
      if (node.kind == Kind::kFirst) {
        picked[0] = 1;
      } else {
        auto indices = node.range.resolve(picked.size());
        if (!indices) {
          return std::unexpected(
              internal::in_context("selection " + to_string_of(node), std::move(indices.error())));
        }
        for (size_t k = 0; k < indices->count; ++k) picked[indices->start + k * indices->step] = 1;
      }
      return along(region, *dim, picked);
    }
    case Kind::kUnion:
    case Kind::kIntersection: {
      auto lhs = mask_of(*node.lhs, region);
      if (!lhs) return lhs;
      auto rhs = mask_of(*node.rhs, region);
      if (!rhs) return rhs;
      for (size_t i = 0; i < lhs->size(); ++i) {
        (*lhs)[i] = node.kind == Kind::kUnion ? ((*lhs)[i] | (*rhs)[i]) : ((*lhs)[i] & (*rhs)[i]);
      }
      return lhs;
    }
  }
  return std::unexpected(make_error(BaseErrc::kInternal, "selection: unknown node kind"));
}

std::string Selection::to_string_of(const Node& node) {
  using Kind = Node::Kind;
  switch (node.kind) {
    case Kind::kAll:
      return "all";
    case Kind::kNone:
      return "none";
    case Kind::kFirst:
      return node.label ? "first(" + *node.label + ")" : "first";
    case Kind::kRange:
      return "range(" + *node.label + ", " + node.range.to_string() + ")";
    case Kind::kUnion:
      return "(" + to_string_of(*node.lhs) + " | " + to_string_of(*node.rhs) + ")";
    case Kind::kIntersection:
      return "(" + to_string_of(*node.lhs) + " & " + to_string_of(*node.rhs) + ")";
  }
  return "?";
}

Selection::Selection() : Selection(all()) {}

Selection Selection::all() { return Selection(std::make_shared<const Node>()); }

Selection Selection::none() {
  return Selection(std::make_shared<const Node>(Node{.kind = Node::Kind::kNone}));
}

Selection Selection::first() {
  return Selection(std::make_shared<const Node>(Node{.kind = Node::Kind::kFirst}));
}

Selection Selection::first(std::string label) {
  return Selection(
      std::make_shared<const Node>(Node{.kind = Node::Kind::kFirst, .label = std::move(label)}));
}

Selection Selection::range(std::string label, Range range) {
  return Selection(std::make_shared<const Node>(
      Node{.kind = Node::Kind::kRange, .label = std::move(label), .range = range}));
}

Selection Selection::union_of(Selection a, Selection b) {
  return Selection(std::make_shared<const Node>(
      Node{.kind = Node::Kind::kUnion, .lhs = std::move(a.node_), .rhs = std::move(b.node_)}));
}

Selection Selection::intersection_of(Selection a, Selection b) {
  return Selection(std::make_shared<const Node>(Node{
      .kind = Node::Kind::kIntersection, .lhs = std::move(a.node_), .rhs = std::move(b.node_)}));
}

Result<std::vector<size_t>> Selection::ranks(const Region& region) const {
  auto mask = mask_of(*node_, region);
  if (!mask) return std::unexpected(std::move(mask.error()));
  std::vector<size_t> out;
  for (size_t rank = 0; rank < mask->size(); ++rank) {
    if ((*mask)[rank]) out.push_back(rank);
  }
  return out;
}

Result<std::vector<size_t>> Selection::base_ranks(const Region& region) const {
  auto mask = mask_of(*node_, region);
  if (!mask) return std::unexpected(std::move(mask.error()));
  // One walk of the slice instead of mapping each selected rank through its coordinates.
  std::vector<size_t> out;
  size_t rank = 0;
  for (size_t base_rank : region.slice()) {
    if ((*mask)[rank++]) out.push_back(base_rank);
  }
  return out;
}

std::string Selection::to_string() const { return to_string_of(*node_); }

}  // namespace podium::ndslice
