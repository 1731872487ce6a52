#include "podium/wire/message.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>

#include <msgpack.hpp>

#include "podium/wire/peer_msgpack.h"

namespace podium::wire {
namespace {

// A frame of `kind` whose header is `header` packed by msgpack-cxx itself.
template <class T>
RawFrame frame_with(FrameKind kind, const T& header, std::vector<std::byte>& storage,
                    std::vector<Buffer> parts = {}) {
  msgpack::sbuffer sb;
  msgpack::pack(sb, header);
  auto b = std::as_bytes(std::span(sb.data(), sb.size()));
  storage.assign(b.begin(), b.end());
  return RawFrame{kind, storage, std::move(parts)};
}

// The one frame `stream` holds, decoded (nullopt, with the test failed, otherwise).
std::optional<Message> only_frame(const std::vector<std::byte>& stream) {
  FrameDecoder dec(FrameLimits{});
  std::vector<RawFrame> frames;
  if (!dec.feed(stream, [&](RawFrame&& f) { frames.push_back(std::move(f)); }) ||
      frames.size() != 1) {
    ADD_FAILURE() << "not one frame";
    return std::nullopt;
  }
  auto m = decode(std::move(frames[0]));
  if (!m) {
    ADD_FAILURE() << m.error().to_string();
    return std::nullopt;
  }
  return std::move(*m);
}

// A Data frame with one part per `parts` and `lent` as its eighth element, decoded.
template <class Lent>
Result<Message> data_with_lent(const Lent& lent, std::vector<Buffer> parts) {
  std::vector<std::byte> s;
  std::map<std::string, std::string> none;
  return decode(frame_with(
      FrameKind::kData,
      std::make_tuple(1, 1, std::string("d"), std::string("s"), 0, 0, none, lent), s,
      std::move(parts)));
}

TEST(WireMessage, DecodesHeadersPackedByMsgpackCxx) {
  std::vector<std::byte> s;
  std::map<std::string, std::string> headers{{"a", "1"}, {"b", std::string(70000, 'z')}};
  auto data = decode(frame_with(FrameKind::kData,
                                std::make_tuple(uint64_t(1) << 33, 200, std::string(40, 'd'),
                                                std::string("s"), 0, uint64_t(-1), headers),
                                s, {Buffer::copy_of("payload")}));
  ASSERT_TRUE(data) << data.error().to_string();
  auto& d = std::get<Data>(*data);
  EXPECT_EQ(d.seq, uint64_t(1) << 33);
  EXPECT_EQ(d.envelope.kind, 200);
  EXPECT_EQ(d.envelope.dest, std::string(40, 'd'));
  EXPECT_EQ(d.envelope.sender, "s");
  EXPECT_EQ(d.envelope.order_seq, uint64_t(-1));
  ASSERT_EQ(d.envelope.headers.size(), 2u);
  EXPECT_EQ(d.envelope.headers[1].second.size(), 70000u);
  ASSERT_EQ(d.envelope.parts.size(), 1u);
  EXPECT_EQ(d.envelope.parts[0].view(), "payload");

  auto hello = decode(frame_with(FrameKind::kHello, std::make_tuple(1, 42, std::string("x")), s));
  ASSERT_TRUE(hello);
  EXPECT_EQ(std::get<Hello>(*hello).session_id, 42u);
}

TEST(WireMessage, OurHeadersAreStandardMsgpack) {
  Envelope e;
  e.kind = 3;
  e.dest = "d";
  e.sender = "s";
  e.order_stream = 5;
  e.order_seq = 6;
  e.headers = {{"k", "v"}};
  std::vector<std::byte> head;
  encode_data(9, e, head);
  auto header = std::span(head).subspan(table_end(0));
  auto oh = msgpack::unpack(reinterpret_cast<const char*>(header.data()), header.size());
  auto t = oh.get().as<std::tuple<uint64_t, int, std::string, std::string, uint64_t, uint64_t,
                                  std::map<std::string, std::string>>>();
  EXPECT_EQ(std::get<0>(t), 9u);
  EXPECT_EQ(std::get<1>(t), 3);
  EXPECT_EQ(std::get<2>(t), "d");
  EXPECT_EQ(std::get<6>(t).at("k"), "v");
}

TEST(WireMessage, RejectsMalformedHeaders) {  // WI-3
  std::vector<std::byte> s;
  auto expect_bad = [](Result<Message> m, std::string_view what) {
    ASSERT_FALSE(m) << what;
    EXPECT_TRUE(m.error().is(WireErrc::kMalformedHeader)) << what;
    EXPECT_NE(m.error().message.find(what), std::string::npos) << m.error().message;
  };
  expect_bad(decode(frame_with(FrameKind::kAck, std::make_tuple(1, 2), s)), "expected [seq]");
  expect_bad(decode(frame_with(FrameKind::kAck, std::make_tuple(-1), s)), "expected [seq]");
  expect_bad(decode(frame_with(FrameKind::kHelloAck, std::string("x"), s)), "expected [seq]");
  expect_bad(decode(frame_with(FrameKind::kHello, std::make_tuple(1, 2, 3), s)),
             "bad listen_address");
  expect_bad(decode(frame_with(FrameKind::kData, std::make_tuple(1, 2), s)),
             "expected an array of 7");
  expect_bad(decode(frame_with(FrameKind::kData,
                               std::make_tuple(1, 256, "d", "s", 0, 0, std::map<int, int>{}), s)),
             "bad kind");
  expect_bad(decode(frame_with(FrameKind::kData,
                               std::make_tuple(1, 2, "d", "s", 0, 0, std::map<int, int>{{1, 2}}),
                               s)),
             "bad header entry");
  expect_bad(decode(frame_with(FrameKind::kAck, std::make_tuple(1), s, {Buffer::copy_of("x")})),
             "carries 1 parts");
  // Trailing bytes after a valid header.
  auto f = frame_with(FrameKind::kAck, std::make_tuple(1), s);
  s.push_back(std::byte{0});
  f.header = s;
  expect_bad(decode(std::move(f)), "trailing bytes");
  // Empty and truncated headers.
  expect_bad(decode(RawFrame{FrameKind::kData, {}, {}}), "expected an array of 7");
  f = frame_with(FrameKind::kHello, std::make_tuple(1, 2, std::string(100, 'a')), s);
  f.header = f.header.first(f.header.size() - 1);
  expect_bad(decode(std::move(f)), "bad listen_address");
  // A map that claims 2^32-1 entries is refused before anything is reserved.
  const uint8_t huge[] = {0x97, 1, 2, 0xa1, 'd', 0xa1, 's', 0, 0, 0xdf, 0xff, 0xff, 0xff, 0xff};
  expect_bad(decode(RawFrame{FrameKind::kData, std::as_bytes(std::span(huge)), {}}),
             "bad headers");
}

TEST(WireMessage, LentPartsTravelAsDescriptorsAndTheirBytesStayOut) {  // WI-8
  Envelope e;
  e.kind = 1;
  e.dest = "d";
  e.sender = "s";
  std::string big(200000, 'b'), big2(70000, 'c');
  e.parts = {Buffer::copy_of("small"), Buffer::copy_of(big), Buffer{}, Buffer::copy_of(big2)};
  std::vector<std::byte> stream;
  encode_data(7, e, stream, 65536);
  // The caller writes only the parts it does not lend: "small".
  auto small = e.parts[0].span();
  stream.insert(stream.end(), small.begin(), small.end());
  auto m = only_frame(stream);
  ASSERT_TRUE(m);
  auto& d = std::get<Data>(*m);
  ASSERT_EQ(d.lent.size(), 2u);
  EXPECT_EQ(d.lent[0].index, 1u);
  EXPECT_EQ(d.lent[0].addr, reinterpret_cast<uintptr_t>(e.parts[1].data()));
  EXPECT_EQ(d.lent[0].len, 200000u);
  EXPECT_EQ(d.lent[1].index, 3u);
  EXPECT_EQ(d.lent[1].len, 70000u);
  ASSERT_EQ(d.envelope.parts.size(), 4u);
  EXPECT_EQ(d.envelope.parts[0].view(), "small");
  EXPECT_TRUE(d.envelope.parts[1].empty());
  EXPECT_TRUE(d.envelope.parts[3].empty());
  // Nothing lent below the threshold: the plain 7-element form.
  std::vector<std::byte> plain, lend_none;
  encode_data(7, e, plain);
  encode_data(7, e, lend_none, 1 << 20);
  EXPECT_EQ(plain, lend_none);

  // Hello's probe and HelloAck's flag round-trip; the old forms still decode.
  Hello h;
  h.session_id = 9;
  h.listen_address = "unix:/x";
  h.flags = kHelloLend;
  h.probe_addr = 0x7fff0000;
  h.probe_value = 0x1234;
  std::vector<std::byte> hs;
  encode(h, hs);
  auto hm = only_frame(hs);
  ASSERT_TRUE(hm);
  EXPECT_EQ(std::get<Hello>(*hm).flags, kHelloLend);
  EXPECT_EQ(std::get<Hello>(*hm).probe_addr, 0x7fff0000u);
  EXPECT_EQ(std::get<Hello>(*hm).probe_value, 0x1234u);
  std::vector<std::byte> as;
  encode(HelloAck{5, kAckPull}, as);
  encode(HelloAck{6}, as);
  std::vector<RawFrame> frames;
  FrameDecoder dec3(FrameLimits{});
  ASSERT_TRUE(dec3.feed(as, [&](RawFrame&& f) { frames.push_back(std::move(f)); }));
  ASSERT_EQ(frames.size(), 2u);
  auto a1 = decode(std::move(frames[0]));
  auto a2 = decode(std::move(frames[1]));
  ASSERT_TRUE(a1 && a2);
  EXPECT_EQ(std::get<HelloAck>(*a1).flags, kAckPull);
  EXPECT_EQ(std::get<HelloAck>(*a2).flags, 0u);
  EXPECT_EQ(std::get<HelloAck>(*a2).delivered_seq, 6u);
}

TEST(WireMessage, BadLentDescriptorsAreMalformed) {  // WI-8
  std::vector<std::byte> s;  // the Hello frames' below
  using Lent = std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>;
  auto data = [](Lent lent, std::vector<Buffer> parts) {
    return data_with_lent(lent, std::move(parts));
  };
  EXPECT_TRUE(data({{0, 4096, 10}}, {Buffer{}}));
  // A part with bytes of its own, an index out of range, 0 bytes, out of order, none at all.
  EXPECT_FALSE(data({{0, 4096, 10}}, {Buffer::copy_of("x")}));
  EXPECT_FALSE(data({{1, 4096, 10}}, {Buffer{}}));
  EXPECT_FALSE(data({{0, 4096, 0}}, {Buffer{}}));
  EXPECT_FALSE(data({{1, 4096, 10}, {0, 4096, 10}}, {Buffer{}, Buffer{}}));
  EXPECT_FALSE(data({}, {Buffer{}}));
  // A probe without kHelloLend, kHelloLend without a probe, an unknown HelloAck flag.
  EXPECT_FALSE(decode(frame_with(FrameKind::kHello,
                                 std::make_tuple(1, 2, std::string(""), std::string(""), 0, 1, 2),
                                 s)));
  EXPECT_FALSE(decode(frame_with(FrameKind::kHello,
                                 std::make_tuple(1, 2, std::string(""), std::string(""), 2), s)));
  EXPECT_FALSE(decode(frame_with(FrameKind::kHelloAck, std::make_tuple(1, 2), s)));
}

TEST(WireMessage, ALentPartInASharedBlockNamesTheBlock) {  // WI-9
  Envelope e;
  e.kind = 1;
  e.dest = "d";
  e.sender = "s";
  std::string big(200000, 'b'), big2(90000, 'c');
  e.parts = {Buffer::copy_of(big), Buffer::copy_of(big2)};
  e.shared.push_back({1, 17, 12345, 99});  // part 1 lies in a block; part 0 does not
  std::vector<std::byte> stream;
  encode_data(3, e, stream, 65536);
  EXPECT_LE(stream.size(), data_frame_bound(e));
  auto m = only_frame(stream);
  ASSERT_TRUE(m);
  auto& d = std::get<Data>(*m);
  ASSERT_EQ(d.lent.size(), 2u);
  EXPECT_EQ(d.lent[0].fd, -1);
  EXPECT_EQ(d.lent[1].fd, 17);
  EXPECT_EQ(d.lent[1].ino, 12345u);
  EXPECT_EQ(d.lent[1].gen, 99u);
  EXPECT_EQ(d.lent[1].len, 90000u);
  // Malformed: four or five fields, a descriptor past INT32_MAX.
  auto with = [](const auto& lent) { return data_with_lent(lent, {Buffer{}}); };
  using Six = std::vector<std::tuple<uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t>>;
  using Four = std::vector<std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>>;
  EXPECT_TRUE(with(Six{{0, 4096, 10, 3, 7, 1}}));
  EXPECT_FALSE(with(Four{{0, 4096, 10, 3}}));
  EXPECT_FALSE(with(Six{{0, 4096, 10, uint64_t{1} << 31, 7, 1}}));
}

TEST(WireMessage, PeerMsgpackLimitRefusesCountsTheBytesCannotHold) {  // WI-7
  // 5 bytes announcing 2^32 - 1 array elements (msgpack-cxx would ask for 128 GiB), a map, a
  // str and a bin of 4 GiB, and nesting past kMaxPeerDepth: each a decode error.
  std::vector<std::string> claims = {"\xdd\xff\xff\xff\xff", "\xdf\xff\xff\xff\xff",
                                     "\xdb\xff\xff\xff\xff", "\xc6\xff\xff\xff\xff",
                                     std::string(kMaxPeerDepth + 1, '\x91') + "\x01"};
  for (const auto& c : claims) {
    SCOPED_TRACE(c.size());
    bool refused = false;
    try {
      (void)msgpack::unpack(c.data(), c.size(), nullptr, nullptr, peer_unpack_limit(c.size()));
    } catch (const msgpack::unpack_error&) {
      refused = true;  // size or depth overflow, or the bytes ran out
    }
    EXPECT_TRUE(refused);
  }
  // Values within their bytes decode as before.
  msgpack::sbuffer sb;
  msgpack::pack(sb, std::make_tuple(std::vector<int>(1000, 7), std::string(300, 'x')));
  auto oh = msgpack::unpack(sb.data(), sb.size(), nullptr, nullptr, peer_unpack_limit(sb.size()));
  EXPECT_EQ(oh.get().via.array.size, 2u);
}

}  // namespace
}  // namespace podium::wire
