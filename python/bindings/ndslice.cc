// podium._core.ndslice: Extent, Point, Range and Region of the C++ ndslice layer, which
// podium's Python meshes, Points and ValueMeshes stand on (Python never re-implements the
// rank arithmetic). Errors follow common.h: unknown label -> TypeError, out of range ->
// IndexError, other shape errors -> ValueError.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <tuple>

#include "common.h"
#include "podium/ndslice/extent.h"
#include "podium/ndslice/point.h"
#include "podium/ndslice/range.h"
#include "podium/ndslice/region.h"
#include "podium/ndslice/slice.h"

namespace podium::python {

using ndslice::Extent;
using ndslice::Point;
using ndslice::Range;
using ndslice::Region;
using ndslice::Slice;

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
}

}  // namespace podium::python
