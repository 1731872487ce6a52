#include "podium/ndslice/codec.h"

#include <exception>

#include "podium/ndslice/errc.h"
#include "podium/ndslice/internal.h"

namespace podium::ndslice {

namespace {

// Nesting of the deepest valid values: Region -> Slice -> sizes, Point -> Extent -> labels.
constexpr size_t kMaxDepth = 3;

auto malformed(std::string_view what, std::string_view why) {
  return std::unexpected(internal::error(NdsliceErrc::kMalformed, {"decode ", what, ": ", why}));
}

bool is_array(const msgpack::object& o, uint32_t size) {
  return o.type == msgpack::type::ARRAY && o.via.array.size == size;
}

Result<size_t> read_size(const msgpack::object& o, std::string_view what) {
  if (o.type != msgpack::type::POSITIVE_INTEGER) return malformed(what, "expected an unsigned int");
  return static_cast<size_t>(o.via.u64);
}

Result<std::vector<size_t>> read_sizes(const msgpack::object& o, std::string_view what) {
  if (o.type != msgpack::type::ARRAY) return malformed(what, "expected an array of unsigned ints");
  std::vector<size_t> out;
  out.reserve(o.via.array.size);
  for (const msgpack::object& item : std::span(o.via.array.ptr, o.via.array.size)) {
    auto value = read_size(item, what);
    if (!value) return std::unexpected(std::move(value.error()));
    out.push_back(*value);
  }
  return out;
}

Result<std::vector<std::string>> read_labels(const msgpack::object& o, std::string_view what) {
  if (o.type != msgpack::type::ARRAY) return malformed(what, "expected an array of labels");
  std::vector<std::string> out;
  out.reserve(o.via.array.size);
  for (const msgpack::object& item : std::span(o.via.array.ptr, o.via.array.size)) {
    if (item.type != msgpack::type::STR) return malformed(what, "expected a string label");
    out.emplace_back(item.via.str.ptr, item.via.str.size);
  }
  return out;
}

}  // namespace

void to_msgpack(Packer& out, const Extent& extent) {
  out.pack_array(2);
  out.pack(extent.labels());
  out.pack(extent.sizes());
}

void to_msgpack(Packer& out, const Slice& slice) {
  out.pack_array(3);
  out.pack(slice.offset());
  out.pack(slice.sizes());
  out.pack(slice.strides());
}

void to_msgpack(Packer& out, const Region& region) {
  out.pack_array(2);
  out.pack(region.labels());
  to_msgpack(out, region.slice());
}

void to_msgpack(Packer& out, const Point& point) {
  out.pack_array(2);
  to_msgpack(out, point.extent());
  out.pack(point.rank());
}

template <>
Result<Extent> from_msgpack<Extent>(const msgpack::object& object) {
  if (!is_array(object, 2)) return malformed("extent", "expected [labels, sizes]");
  auto labels = read_labels(object.via.array.ptr[0], "extent labels");
  if (!labels) return std::unexpected(std::move(labels.error()));
  auto sizes = read_sizes(object.via.array.ptr[1], "extent sizes");
  if (!sizes) return std::unexpected(std::move(sizes.error()));
  return Extent::make(std::move(*labels), std::move(*sizes));  // SL-8
}

template <>
Result<Slice> from_msgpack<Slice>(const msgpack::object& object) {
  if (!is_array(object, 3)) return malformed("slice", "expected [offset, sizes, strides]");
  auto offset = read_size(object.via.array.ptr[0], "slice offset");
  if (!offset) return std::unexpected(std::move(offset.error()));
  auto sizes = read_sizes(object.via.array.ptr[1], "slice sizes");
  if (!sizes) return std::unexpected(std::move(sizes.error()));
  auto strides = read_sizes(object.via.array.ptr[2], "slice strides");
  if (!strides) return std::unexpected(std::move(strides.error()));
  return Slice::make(*offset, std::move(*sizes), std::move(*strides));  // SL-8
}

template <>
Result<Region> from_msgpack<Region>(const msgpack::object& object) {
  if (!is_array(object, 2)) return malformed("region", "expected [labels, slice]");
  auto labels = read_labels(object.via.array.ptr[0], "region labels");
  if (!labels) return std::unexpected(std::move(labels.error()));
  auto slice = from_msgpack<Slice>(object.via.array.ptr[1]);
  if (!slice) return std::unexpected(std::move(slice.error()));
  return Region::make(std::move(*labels), std::move(*slice));  // SL-8
}

template <>
Result<Point> from_msgpack<Point>(const msgpack::object& object) {
  if (!is_array(object, 2)) return malformed("point", "expected [extent, rank]");
  auto extent = from_msgpack<Extent>(object.via.array.ptr[0]);
  if (!extent) return std::unexpected(std::move(extent.error()));
  auto rank = read_size(object.via.array.ptr[1], "point rank");
  if (!rank) return std::unexpected(std::move(rank.error()));
  return extent->point_of_rank(*rank);  // SL-8
}

template <class T>
std::string encode(const T& value) {
  msgpack::sbuffer buffer;
  Packer packer(buffer);
  to_msgpack(packer, value);
  return std::string(buffer.data(), buffer.size());
}

template <class T>
Result<T> decode(std::string_view bytes) {
  // Every array element and string byte takes at least one input byte.
  size_t n = bytes.size();
  msgpack::unpack_limit limit(n, n, n, n, n, kMaxDepth);
  size_t consumed = 0;
  msgpack::object_handle handle;
  // msgpack-cxx reports malformed input by throwing; this is the one place it can.
  try {
    handle = msgpack::unpack(bytes.data(), n, consumed, nullptr, nullptr, limit);
  } catch (const std::exception& e) {
    return malformed("bytes", e.what());
  }
  if (consumed != n) {
    return malformed("bytes", std::to_string(n - consumed) + " trailing bytes after the value");
  }
  return from_msgpack<T>(handle.get());
}

template std::string encode<Extent>(const Extent&);
template std::string encode<Slice>(const Slice&);
template std::string encode<Region>(const Region&);
template std::string encode<Point>(const Point&);
template Result<Extent> decode<Extent>(std::string_view);
template Result<Slice> decode<Slice>(std::string_view);
template Result<Region> decode<Region>(std::string_view);
template Result<Point> decode<Point>(std::string_view);

}  // namespace podium::ndslice
