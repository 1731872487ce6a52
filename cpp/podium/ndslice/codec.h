// msgpack encoding of the ndslice values that cross processes inside messages (a mesh
// reference carries its Region, a reply its Point). Layouts, one msgpack array each:
//   Extent  [[label, ...], [size, ...]]
//   Slice   [offset, [size, ...], [stride, ...]]
//   Region  [[label, ...], Slice]
//   Point   [Extent, rank]
//
// Invariants:
//   SL-8  decoding rebuilds every value through its make(), so a decoded value satisfies the
//         same invariants as a local one (SL-1, SL-3, SL-5) whatever the sender wrote; a
//         wrong layout, or nesting deeper than 3, is kMalformed; decode() never throws
//         (below).
//
// Separate from the value headers so that only code that encodes pays for msgpack.hpp.
#pragma once

#include <msgpack.hpp>
#include <string>
#include <string_view>

#include "podium/base/error.h"
#include "podium/ndslice/extent.h"
#include "podium/ndslice/point.h"
#include "podium/ndslice/region.h"
#include "podium/ndslice/slice.h"

namespace podium::ndslice {

using Packer = msgpack::packer<msgpack::sbuffer>;

// Appends one msgpack value to `out`.
void to_msgpack(Packer& out, const Extent& extent);
void to_msgpack(Packer& out, const Slice& slice);
void to_msgpack(Packer& out, const Region& region);
void to_msgpack(Packer& out, const Point& point);

// Reads one value of type T (Extent, Slice, Region or Point) from an unpacked object.
// kMalformed when the object has the wrong layout, or the error of T's make().
template <class T>
[[nodiscard]] Result<T> from_msgpack(const msgpack::object& object) = delete;
template <>
[[nodiscard]] Result<Extent> from_msgpack<Extent>(const msgpack::object& object);
template <>
[[nodiscard]] Result<Slice> from_msgpack<Slice>(const msgpack::object& object);
template <>
[[nodiscard]] Result<Region> from_msgpack<Region>(const msgpack::object& object);
template <>
[[nodiscard]] Result<Point> from_msgpack<Point>(const msgpack::object& object);

// Whole-buffer forms: exactly one msgpack value, no trailing bytes. decode() never throws:
// msgpack's parse errors become kMalformed, and no array or string may claim more elements
// than the input has bytes, so hostile input cannot force a large allocation.
template <class T>
std::string encode(const T& value);
template <class T>
[[nodiscard]] Result<T> decode(std::string_view bytes);

// Instantiated in codec.cc for these types only.
extern template std::string encode<Extent>(const Extent&);
extern template std::string encode<Slice>(const Slice&);
extern template std::string encode<Region>(const Region&);
extern template std::string encode<Point>(const Point&);
extern template Result<Extent> decode<Extent>(std::string_view);
extern template Result<Slice> decode<Slice>(std::string_view);
extern template Result<Region> decode<Region>(std::string_view);
extern template Result<Point> decode<Point>(std::string_view);

}  // namespace podium::ndslice
