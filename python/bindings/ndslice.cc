// podium._core.ndslice: Extent, Point, Range and Region of the C++ ndslice layer, which
// podium's Python meshes, Points and ValueMeshes stand on (Python never re-implements the
// rank arithmetic), and the public `podium.Slice`, `podium.Shape` and `podium.Selection`
// (Monarch's `monarch._rust_bindings.monarch_hyperactor.shape` / `.selection` names, over
// ndslice::Slice, ndslice::Region and ndslice::Selection). Errors follow common.h: unknown
// label -> TypeError, out of range -> IndexError, other shape errors -> ValueError; except
// where Monarch documents otherwise (Slice.index / Slice.coordinates of a rank that is not in
// the slice: ValueError).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>

#include "common.h"
#include "podium/ndslice/extent.h"
#include "podium/ndslice/point.h"
#include "podium/ndslice/range.h"
#include "podium/ndslice/region.h"
#include "podium/ndslice/selection.h"
#include "podium/ndslice/slice.h"

namespace podium::python {

using ndslice::Extent;
using ndslice::Point;
using ndslice::Range;
using ndslice::Region;
using ndslice::Selection;
using ndslice::Slice;

namespace {

// podium.Shape: a Region (labels over a Slice) under Monarch's Shape API. Its own type, so
// that the internal `Region` binding keeps its methods.
struct Shape {
  Region region;
};

// A Python slice object -> Range (step None means 1).
Range range_of_pyslice(nb::handle s) {
  auto get = [&](const char* name) -> std::optional<int64_t> {
    nb::object v = s.attr(name);
    if (v.is_none()) return std::nullopt;
    return nb::cast<int64_t>(v);
  };
  return Range{get("start"), get("stop"), get("step").value_or(1)};
}

std::vector<size_t> slice_ranks(const Slice& s) {
  std::vector<size_t> out;
  out.reserve(s.num_ranks());
  for (size_t r : s) out.push_back(r);
  return out;
}

Slice make_slice(size_t offset, std::vector<size_t> sizes, std::vector<size_t> strides) {
  return unwrap(Slice::make(offset, std::move(sizes), std::move(strides)));
}

// Monarch's Slice.index / .coordinates raise ValueError for a value outside the slice.
template <class T>
T unwrap_value_error(Result<T> r, size_t value, const Slice& s) {
  if (!r) {
    throw nb::value_error(
        ("value " + std::to_string(value) + " is not in " + s.to_string()).c_str());
  }
  return std::move(*r);
}

nb::object public_extent(const Extent& e) {
  return nb::module_::import_("podium._src.shape").attr("Extent").attr("_wrap")(nb::cast(e));
}

// Shape.at / Shape.index(label=int): as Monarch's Shape, ValueError for a dimension the
// shape lacks and for an index outside 0..size-1 (a negative index is not counted from the
// end here, unlike mesh.slice).
Shape shape_at(const Shape& sh, std::string_view label, int64_t index) {
  const auto& labels = sh.region.labels();
  if (std::find(labels.begin(), labels.end(), label) == labels.end()) {
    throw nb::value_error(("Shape.at: no dimension '" + std::string(label) + "' in " +
                           sh.region.to_string())
                              .c_str());
  }
  size_t size = unwrap(sh.region.size(label));
  if (index < 0 || static_cast<uint64_t>(index) >= size) {
    throw nb::value_error(("Shape.at: index " + std::to_string(index) + " out of range for '" +
                           std::string(label) + "' of size " + std::to_string(size) +
                           (size == 0 ? "" : " (valid 0.." + std::to_string(size - 1) + ")"))
                              .c_str());
  }
  return Shape{unwrap(sh.region.select(label, index))};
}

}  // namespace

RegionState region_state(const Region& r) {
  const Slice& s = r.slice();
  return {r.labels(), s.offset(), s.sizes(), s.strides()};
}

Region region_from_state(const RegionState& st) {
  const auto& [labels, offset, sizes, strides] = st;
  auto slice = unwrap(Slice::make(offset, sizes, strides));
  return unwrap(Region::make(labels, std::move(slice)));
}

void bind_ndslice(nb::module_& m) {
  nb::class_<Extent>(m, "Extent")
      .def("__init__",
           [](Extent* self, std::vector<std::string> labels, std::vector<size_t> sizes) {
             new (self) Extent(unwrap(Extent::make(std::move(labels), std::move(sizes))));
           },
           nb::arg("labels"), nb::arg("sizes"))
      .def_prop_ro("labels", &Extent::labels)
      .def_prop_ro("sizes", &Extent::sizes)
      .def_prop_ro("ndim", &Extent::ndim)
      .def_prop_ro("num_ranks", &Extent::num_ranks)
      .def("size", [](const Extent& e, std::string_view label) { return unwrap(e.size(label)); })
      .def("point_of_rank",
           [](const Extent& e, size_t rank) { return unwrap(e.point_of_rank(rank)); })
      .def("rank_of",
           [](const Extent& e, std::vector<size_t> coords) { return unwrap(e.rank_of(coords)); })
      .def("__str__", &Extent::to_string)
      .def("__eq__", [](const Extent& a, const Extent& b) { return a == b; })
      .def("__hash__", [](const Extent& e) { return nb::hash(nb::str(e.to_string().c_str())); });

  nb::class_<Point>(m, "Point")
      .def_static("make",
                  [](const Extent& e, std::vector<size_t> coords) {
                    return unwrap(Point::make(e, std::move(coords)));
                  })
      .def_prop_ro("extent", &Point::extent)
      .def_prop_ro("coords", &Point::coords)
      .def_prop_ro("rank", &Point::rank)
      .def("get", [](const Point& p, std::string_view label) { return unwrap(p.get(label)); })
      .def("__str__", &Point::to_string)
      .def("__eq__", [](const Point& a, const Point& b) { return a == b; });

  nb::class_<Range>(m, "Range")
      .def("__init__",
           [](Range* self, std::optional<int64_t> start, std::optional<int64_t> stop,
              std::optional<int64_t> step) {
             new (self) Range{start, stop, step.value_or(1)};
           },
           nb::arg("start").none(), nb::arg("stop").none(), nb::arg("step").none())
      .def("__str__", &Range::to_string);

  nb::class_<Region>(m, "Region")
      .def(nb::init<Extent>())
      .def_prop_ro("extent", &Region::extent)
      .def_prop_ro("num_ranks", &Region::num_ranks)
      .def("select", [](const Region& r, std::string_view label,
                        int64_t index) { return unwrap(r.select(label, index)); })
      .def("select", [](const Region& r, std::string_view label,
                        const Range& range) { return unwrap(r.select(label, range)); })
      .def("split",
           [](const Region& r, std::string_view label, std::vector<std::string> labels,
              std::vector<int64_t> sizes) {
             return unwrap(r.split(label, std::move(labels), std::move(sizes)));
           })
      .def("flatten", [](const Region& r, std::string label) { return unwrap(r.flatten(label)); })
      .def("rename", [](const Region& r, std::string_view from,
                        std::string to) { return unwrap(r.rename(from, std::move(to))); })
      .def("base_ranks", &Region::base_ranks)
      .def("base_rank", [](const Region& r, size_t rank) { return unwrap(r.base_rank(rank)); })
      .def("rank_of_base",
           [](const Region& r, size_t base) { return unwrap(r.rank_of_base(base)); })
      .def_prop_ro("offset", [](const Region& r) { return r.slice().offset(); })
      .def_prop_ro("strides", [](const Region& r) { return r.slice().strides(); })
      .def("__eq__", [](const Region& a, const Region& b) { return a == b; })
      .def("__getstate__", &region_state)
      .def("__setstate__",
           [](Region& self, const RegionState& st) { new (&self) Region(region_from_state(st)); })
      .def("__str__", &Region::to_string);

  // --- public: podium.Slice ---------------------------------------------------------------
  nb::class_<Slice>(m, "Slice")
      .def("__init__",
           [](Slice* self, size_t offset, std::vector<size_t> sizes, std::vector<size_t> strides) {
             new (self) Slice(make_slice(offset, std::move(sizes), std::move(strides)));
           },
           nb::kw_only(), nb::arg("offset"), nb::arg("sizes"), nb::arg("strides"))
      .def_static("new_row_major",
                  [](std::vector<size_t> sizes) {
                    std::vector<std::string> labels;
                    for (size_t i = 0; i < sizes.size(); ++i) labels.push_back("d" + std::to_string(i));
                    return Slice::row_major(unwrap(Extent::make(std::move(labels), std::move(sizes))));
                  },
                  nb::arg("sizes"), "The dense row-major slice of `sizes` at offset 0.")
      .def_prop_ro("ndim", &Slice::ndim)
      .def_prop_ro("offset", &Slice::offset)
      .def_prop_ro("sizes", &Slice::sizes)
      .def_prop_ro("strides", &Slice::strides)
      .def("get", [](const Slice& s, size_t index) { return unwrap(s.location_of_index(index)); },
           nb::arg("index"), "The location (base rank) of the index-th element in row-major order.")
      .def("index",
           [](const Slice& s, size_t value) {
             return unwrap_value_error(s.index_of(value), value, s);
           },
           nb::arg("value"), "The row-major index of location `value`; ValueError if absent.")
      .def("coordinates",
           [](const Slice& s, size_t value) {
             return unwrap_value_error(s.coordinates_of(value), value, s);
           },
           nb::arg("value"))
      .def("nditem",
           [](const Slice& s, std::vector<size_t> coords) { return unwrap(s.location(coords)); },
           nb::arg("coordinates"))
      .def("__contains__", [](const Slice& s, size_t value) { return s.contains(value); })
      .def("__len__", &Slice::num_ranks)
      .def("__iter__", [](const Slice& s) { return nb::iter(nb::cast(slice_ranks(s))); })
      .def("__getitem__",
           [](const Slice& s, int64_t i) {
             int64_t n = static_cast<int64_t>(s.num_ranks());
             if (i < 0) i += n;
             if (i < 0 || i >= n) throw nb::index_error("Slice index out of range");
             return unwrap(s.location_of_index(static_cast<size_t>(i)));
           })
      .def("__getitem__",
           [](const Slice& s, nb::slice sl) {
             auto [start, stop, step, count] = sl.compute(s.num_ranks());
             nb::list out;
             for (size_t k = 0; k < count; ++k) {
               out.append(unwrap(s.location_of_index(static_cast<size_t>(
                   static_cast<Py_ssize_t>(start) + static_cast<Py_ssize_t>(k) * step))));
             }
             return nb::tuple(out);
           })
      .def("__eq__", [](const Slice& a, const Slice& b) { return a == b; })
      .def("__eq__", [](const Slice&, nb::handle) { return false; })
      .def("__hash__", [](const Slice& s) { return nb::hash(nb::str(s.to_string().c_str())); })
      .def("__repr__", &Slice::to_string)
      .def("__getstate__",
           [](const Slice& s) { return std::make_tuple(s.offset(), s.sizes(), s.strides()); })
      .def("__setstate__",
           [](Slice& self,
              const std::tuple<size_t, std::vector<size_t>, std::vector<size_t>>& st) {
             new (&self) Slice(make_slice(std::get<0>(st), std::get<1>(st), std::get<2>(st)));
           });

  // --- public: podium.Shape ---------------------------------------------------------------
  nb::class_<Shape>(m, "Shape")
      .def("__init__",
           [](Shape* self, std::vector<std::string> labels, const Slice& slice) {
             new (self) Shape{unwrap(Region::make(std::move(labels), slice))};
           },
           nb::arg("labels"), nb::arg("slice"))
      .def_static("unity", [] { return Shape{Region{}}; })
      .def_prop_ro("labels", [](const Shape& sh) { return sh.region.labels(); })
      .def_prop_ro("ndslice", [](const Shape& sh) { return sh.region.slice(); })
      .def_prop_ro("extent", [](const Shape& sh) { return public_extent(sh.region.extent()); })
      .def("coordinates",
           [](const Shape& sh, size_t rank) {
             const Slice& s = sh.region.slice();
             auto coords = unwrap_value_error(s.coordinates_of(rank), rank, s);
             nb::dict out;
             for (size_t i = 0; i < coords.size(); ++i) {
               out[nb::str(sh.region.labels()[i].c_str())] = coords[i];
             }
             return out;
           },
           nb::arg("rank"), "The coordinates of base rank `rank` in this shape.")
      .def("at", &shape_at, nb::arg("label"), nb::arg("index"))
      .def("select",
           [](const Shape& sh, std::string_view label, nb::slice sl) {
             return Shape{unwrap(sh.region.select(label, range_of_pyslice(sl)))};
           },
           nb::arg("label"), nb::arg("slice"))
      .def("index",
           [](const Shape& sh, nb::kwargs kwargs) {
             Shape out = sh;
             for (auto [k, v] : kwargs) {
               std::string label = nb::cast<std::string>(k);
               if (nb::isinstance<nb::slice>(v)) {
                 out = Shape{unwrap(out.region.select(label, range_of_pyslice(v)))};
               } else {
                 out = shape_at(out, label, nb::cast<int64_t>(v));
               }
             }
             return out;
           })
      .def("ranks", [](const Shape& sh) { return slice_ranks(sh.region.slice()); },
           "The base ranks of this shape, in row-major order.")
      .def("__len__", [](const Shape& sh) { return sh.region.num_ranks(); })
      .def("__eq__", [](const Shape& a, const Shape& b) { return a.region == b.region; })
      .def("__eq__", [](const Shape&, nb::handle) { return false; })
      .def("__hash__",
           [](const Shape& sh) { return nb::hash(nb::str(sh.region.to_string().c_str())); })
      .def("__str__", [](const Shape& sh) { return sh.region.to_string(); })
      .def("__repr__", [](const Shape& sh) { return "Shape(" + sh.region.to_string() + ")"; })
      .def("__getstate__", [](const Shape& sh) { return region_state(sh.region); })
      .def("__setstate__", [](Shape& self, const RegionState& st) {
        new (&self) Shape{region_from_state(st)};
      });

  // --- public: podium.Selection -----------------------------------------------------------
  nb::class_<Selection>(m, "Selection")
      .def_static("all", [] { return Selection::all(); })
      .def_static("none", [] { return Selection::none(); })
      .def_static("first",
                  [](std::optional<std::string> label) {
                    return label ? Selection::first(std::move(*label)) : Selection::first();
                  },
                  nb::arg("label").none() = nb::none())
      .def_static("range",
                  [](std::string label, nb::object r) {
                    if (nb::isinstance<nb::slice>(r)) {
                      return Selection::range(std::move(label), range_of_pyslice(r));
                    }
                    int64_t i = nb::cast<int64_t>(r);
                    // One index: the range i:i+1 (i == -1 means the last one).
                    std::optional<int64_t> stop = i == -1 ? std::nullopt : std::optional(i + 1);
                    return Selection::range(std::move(label), Range{i, stop, 1});
                  },
                  nb::arg("label"), nb::arg("range"))
      .def("__or__", [](const Selection& a, const Selection& b) { return a | b; })
      .def("__and__", [](const Selection& a, const Selection& b) { return a & b; })
      .def("ranks",
           [](const Selection& sel, const Shape& sh) { return unwrap(sel.ranks(sh.region)); },
           nb::arg("shape"), "The selected ranks of `shape` (0-based within it), in order.")
      .def("base_ranks",
           [](const Selection& sel, const Shape& sh) {
             return unwrap(sel.base_ranks(sh.region));
           },
           nb::arg("shape"), "The base ranks of the selected points, in the shape's order.")
      .def("__repr__", [](const Selection& sel) { return "Selection(" + sel.to_string() + ")"; })
      .def("__str__", &Selection::to_string);
}

}  // namespace podium::python
