#include "podium/ndslice/codec.h"

#include <gtest/gtest.h>

#include "podium/ndslice/errc.h"

namespace podium::ndslice {
namespace {

Region hosts_gpus() { return Region(*Extent::make({"hosts", "gpus"}, {2, 4})); }

// Packs `fill` into bytes, for hand-made (possibly invalid) encodings.
template <class Fill>
std::string pack(Fill fill) {
  msgpack::sbuffer buffer;
  Packer packer(buffer);
  fill(packer);
  return std::string(buffer.data(), buffer.size());
}

TEST(CodecTest, RoundTrips) {
  // SL-8
  Extent extent = *Extent::make({"hosts", "gpus"}, {2, 4});
  EXPECT_EQ(*decode<Extent>(encode(extent)), extent);
  EXPECT_EQ(*decode<Extent>(encode(Extent())), Extent());

  Slice slice = *Slice::make(5, {3, 2}, {7, 2});
  EXPECT_EQ(*decode<Slice>(encode(slice)), slice);

  Region region = *hosts_gpus().select("gpus", Range{1, std::nullopt, 2});
  EXPECT_EQ(*decode<Region>(encode(region)), region);
  EXPECT_EQ(*decode<Region>(encode(Region())), Region());

  Point point = *extent.point_of_rank(6);
  auto decoded = decode<Point>(encode(point));
  ASSERT_TRUE(decoded);
  EXPECT_EQ(*decoded, point);
  EXPECT_EQ(decoded->to_string(), "{'hosts': 1/2, 'gpus': 2/4}");
}

TEST(CodecTest, ObjectLevelInsideALargerMessage) {
  // A Region embedded in a caller's own message: [tag, region].
  std::string bytes = pack([](Packer& p) {
    p.pack_array(2);
    p.pack(std::string("cast"));
    to_msgpack(p, *hosts_gpus().select("hosts", 1));
  });
  msgpack::object_handle handle = msgpack::unpack(bytes.data(), bytes.size());
  auto region = from_msgpack<Region>(handle.get().via.array.ptr[1]);
  ASSERT_TRUE(region) << region.error().to_string();
  EXPECT_EQ(region->base_ranks(), (std::vector<size_t>{4, 5, 6, 7}));
}

TEST(CodecTest, LayoutIsDocumented) {
  // docs/ndslice.md: Slice is [offset, sizes, strides].
  std::string expected = pack([](Packer& p) {
    p.pack_array(3);
    p.pack(5);
    p.pack(std::vector<size_t>{3});
    p.pack(std::vector<size_t>{2});
  });
  EXPECT_EQ(encode(*Slice::make(5, {3}, {2})), expected);
}

TEST(CodecTest, RejectsMalformedBytes) {
  auto is_malformed = [](const auto& result) {
    return !result && result.error().is(NdsliceErrc::kMalformed);
  };
  EXPECT_TRUE(is_malformed(decode<Region>("")));
  EXPECT_TRUE(is_malformed(decode<Region>("\xc1")));  // never-used msgpack byte
  std::string good = encode(hosts_gpus());
  EXPECT_TRUE(is_malformed(decode<Region>(good.substr(0, good.size() - 1))));
  EXPECT_TRUE(is_malformed(decode<Region>(good + "x")));  // trailing bytes
  // An array32 that claims 4 billion elements in a 5-byte message.
  EXPECT_TRUE(is_malformed(decode<Extent>(std::string("\xdd\xff\xff\xff\xff", 5))));
  // Wrong shapes and types.
  EXPECT_TRUE(is_malformed(decode<Slice>(encode(hosts_gpus()))));
  EXPECT_TRUE(is_malformed(decode<Extent>(pack([](Packer& p) { p.pack(7); }))));
  EXPECT_TRUE(is_malformed(decode<Extent>(pack([](Packer& p) {
    p.pack_array(2);
    p.pack(std::vector<int>{1});
    p.pack(std::vector<size_t>{1});
  }))));
  EXPECT_TRUE(is_malformed(decode<Slice>(pack([](Packer& p) {
    p.pack_array(3);
    p.pack(-1);
    p.pack(std::vector<size_t>{});
    p.pack(std::vector<size_t>{});
  }))));
}

TEST(CodecTest, DecodedValuesKeepTheirInvariants) {
  // SL-8: decoding goes through make(), so a sender cannot smuggle in an invalid value.
  auto extent = decode<Extent>(pack([](Packer& p) {
    p.pack_array(2);
    p.pack(std::vector<std::string>{"a", "a"});
    p.pack(std::vector<size_t>{1, 2});
  }));
  EXPECT_TRUE(extent.error().is(NdsliceErrc::kDuplicateLabel));

  auto slice = decode<Slice>(pack([](Packer& p) {
    p.pack_array(3);
    p.pack(0);
    p.pack(std::vector<size_t>{2, 2});
    p.pack(std::vector<size_t>{1, 1});
  }));
  EXPECT_TRUE(slice.error().is(NdsliceErrc::kBadLayout));

  auto region = decode<Region>(pack([](Packer& p) {
    p.pack_array(2);
    p.pack(std::vector<std::string>{"x", "y"});
    to_msgpack(p, *Slice::make(0, {2}, {1}));
  }));
  EXPECT_TRUE(region.error().is(NdsliceErrc::kBadShape));

  auto point = decode<Point>(pack([](Packer& p) {
    p.pack_array(2);
    to_msgpack(p, *Extent::make({"a"}, {3}));
    p.pack(3);
  }));
  EXPECT_TRUE(point.error().is(NdsliceErrc::kOutOfRange));
}

}  // namespace
}  // namespace podium::ndslice
