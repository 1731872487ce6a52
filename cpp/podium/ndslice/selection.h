// podium::ndslice::Selection — which points of a Region a cast reaches, as an expression
// evaluated against the Region at the time of the cast.
//
// A Selection is an immutable tree; each node is a predicate on a point p of the region:
//   all()                 every point.
//   none()                no point.
//   first()               the region's rank 0 only.
//   first(label)          points whose coordinate along `label` is 0 (the first row of that
//                         dimension; the other dimensions are kept whole).
//   range(label, r)       points whose coordinate along `label` is one of the indices r picks
//                         (Range::resolve: Python slice semantics, clamped; may pick none).
//   a | b, union_of       points in a or in b.
//   a & b, intersection_of
//                         points in a and in b.
// Coordinates are the region's own (0-based within the region), not the root mesh's.
//
// Invariants:
//   SL-7  evaluation yields each selected point once, in the region's rank order; it fails
//         (kUnknownLabel, kBadStep) when any node of the tree names a label the region
//         lacks or has a bad step, even in a branch that would not change the result.
//
// Value type; copies share the tree; safe to share between threads.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "podium/base/error.h"
#include "podium/ndslice/range.h"

namespace podium::ndslice {

class Region;

class Selection {
 public:
  // all()
  Selection();

  static Selection all();
  static Selection none();
  static Selection first();
  static Selection first(std::string label);
  static Selection range(std::string label, Range range);
  static Selection union_of(Selection a, Selection b);
  static Selection intersection_of(Selection a, Selection b);
  friend Selection operator|(Selection a, Selection b) {
    return union_of(std::move(a), std::move(b));
  }
  friend Selection operator&(Selection a, Selection b) {
    return intersection_of(std::move(a), std::move(b));
  }

  // SL-7: the selected ranks of `region`, in rank order.
  [[nodiscard]] Result<std::vector<size_t>> ranks(const Region& region) const;
  // SL-7: the base ranks of the selected points, in the region's rank order.
  [[nodiscard]] Result<std::vector<size_t>> base_ranks(const Region& region) const;

  // "(range(gpus, 0:4) & first(hosts))"
  std::string to_string() const;

 private:
  struct Node;
  explicit Selection(std::shared_ptr<const Node> node) : node_(std::move(node)) {}
  // One byte per rank of `region`, 1 when selected.
  static Result<std::vector<char>> mask_of(const Node& node, const Region& region);
  static std::string to_string_of(const Node& node);

  std::shared_ptr<const Node> node_;
};

}  // namespace podium::ndslice
