#include "podium/wire/frame.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "podium/wire/message.h"

namespace podium::wire {
namespace {

std::vector<std::byte> bytes_of(std::string_view s) {
  auto b = std::as_bytes(std::span(s.data(), s.size()));
  return {b.begin(), b.end()};
}

Buffer pattern(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(uint8_t(seed + i * 7 + (i >> 8)));
  return Buffer::from_vector(std::move(v));
}

// The whole frame as the peer receives it: the encoded head, then each part.
std::vector<std::byte> wire_bytes(const std::vector<std::byte>& head, const Envelope& env) {
  std::vector<std::byte> out = head;
  for (const auto& p : env.parts) out.insert(out.end(), p.span().begin(), p.span().end());
  return out;
}

Envelope sample(std::vector<Buffer> parts) {
  Envelope e;
  e.kind = 7;
  e.dest = "proc[3].actor[0].port[12]";
  e.sender = "client[0].main[0]";
  e.order_stream = 0x1234567890abcdefULL;
  e.order_seq = 99;
  e.headers = {{"trace", "abc"}, {"", ""}, {"k", std::string(300, 'x')}};
  e.parts = std::move(parts);
  return e;
}

void expect_same(const Envelope& a, const Envelope& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.dest, b.dest);
  EXPECT_EQ(a.sender, b.sender);
  EXPECT_EQ(a.order_stream, b.order_stream);
  EXPECT_EQ(a.order_seq, b.order_seq);
  EXPECT_EQ(a.headers, b.headers);
  ASSERT_EQ(a.parts.size(), b.parts.size());
  for (size_t i = 0; i < a.parts.size(); ++i) {
    ASSERT_EQ(a.parts[i].size(), b.parts[i].size()) << "part " << i;
    // memcmp's pointers must not be null even for 0 bytes, and an empty part's data() is.
    if (a.parts[i].size() == 0) continue;
    EXPECT_EQ(0, std::memcmp(a.parts[i].data(), b.parts[i].data(), a.parts[i].size()))
        << "part " << i;
  }
}

// Decodes `stream` split into reads of the sizes `chunk` returns, like a socket would, and
// collects the messages.
template <class Chunk>
std::vector<Message> decode_stream(std::span<const std::byte> stream, Chunk chunk,
                                   FrameLimits limits = {}) {
  FrameDecoder d(limits);
  std::vector<Message> out;
  size_t at = 0;
  for (;;) {
    RawFrame f;
    for (;;) {
      auto ready = d.next(f);
      EXPECT_TRUE(ready.has_value()) << ready.error().to_string();
      if (!ready || !*ready) break;
      auto m = decode(std::move(f));
      EXPECT_TRUE(m.has_value()) << m.error().to_string();
      if (m) out.push_back(std::move(*m));
    }
    if (at == stream.size()) break;
    auto to = d.prepare();
    EXPECT_FALSE(to.empty());
    size_t n = std::min({to.size(), stream.size() - at, chunk()});
    std::memcpy(to.data(), stream.data() + at, n);
    d.commit(n);
    at += n;
  }
  EXPECT_FALSE(d.mid_frame());
  return out;
}

TEST(WireFrame, HeadLayoutIsLittleEndianAndHoldsNoPartBytes) {  // WI-1
  Envelope e = sample({pattern(100000, 1), pattern(3, 2)});
  std::vector<std::byte> head;
  encode_data(5, e, head);
  ASSERT_GE(head.size(), table_end(2));
  EXPECT_EQ(std::memcmp(head.data(), "PDM", 3), 0);
  EXPECT_EQ(head[3], std::byte{kFrameVersion});
  EXPECT_EQ(head[4], std::byte{uint8_t(FrameKind::kData)});
  EXPECT_EQ(head[5], std::byte{0});
  EXPECT_EQ(head[6], std::byte{2});  // part_count, u16 LE
  EXPECT_EQ(head[7], std::byte{0});
  uint32_t header_len = std::to_integer<uint32_t>(head[8]) |
                        std::to_integer<uint32_t>(head[9]) << 8 |
                        std::to_integer<uint32_t>(head[10]) << 16 |
                        std::to_integer<uint32_t>(head[11]) << 24;
  EXPECT_EQ(head.size(), table_end(2) + header_len);
  EXPECT_EQ(head[12], std::byte{0xa0});  // 100000 = 0x186a0, u64 LE
  EXPECT_EQ(head[13], std::byte{0x86});
  EXPECT_EQ(head[14], std::byte{0x01});
  EXPECT_EQ(head[20], std::byte{3});
  EXPECT_LT(head.size(), 600u);  // the 100000-byte part is not in the head
  EXPECT_LE(head.size() + 100003, data_frame_bound(e));
}

TEST(WireFrame, DataRoundTripsWithZeroOneAndManyParts) {
  for (size_t parts : {0, 1, 2, 17}) {
    std::vector<Buffer> ps;
    for (size_t i = 0; i < parts; ++i) ps.push_back(pattern(i * 13, uint8_t(i)));
    Envelope e = sample(std::move(ps));
    std::vector<std::byte> head;
    encode_data(1000 + parts, e, head);
    auto msgs = decode_stream(wire_bytes(head, e), [] { return size_t(1) << 20; });
    ASSERT_EQ(msgs.size(), 1u);
    auto* d = std::get_if<Data>(&msgs[0]);
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(d->seq, 1000 + parts);
    expect_same(d->envelope, e);
  }
}

TEST(WireFrame, ControlFramesRoundTrip) {
  std::vector<std::byte> stream;
  encode(Hello{kSessionProtocolVersion, 0xfeedfacecafebeefULL, "unix:/run/p/a.sock"}, stream);
  encode(HelloAck{0}, stream);
  encode(HelloAck{uint64_t(1) << 40}, stream);
  encode(Ack{77}, stream);
  auto msgs = decode_stream(stream, [] { return size_t(1); });
  ASSERT_EQ(msgs.size(), 4u);
  auto& h = std::get<Hello>(msgs[0]);
  EXPECT_EQ(h.protocol_version, kSessionProtocolVersion);
  EXPECT_EQ(h.session_id, 0xfeedfacecafebeefULL);
  EXPECT_EQ(h.listen_address, "unix:/run/p/a.sock");
  EXPECT_EQ(std::get<HelloAck>(msgs[1]).delivered_seq, 0u);
  EXPECT_EQ(std::get<HelloAck>(msgs[2]).delivered_seq, uint64_t(1) << 40);
  EXPECT_EQ(std::get<Ack>(msgs[3]).seq, 77u);
}

TEST(WireFrame, AHelloNamesTheAddressItIsForAndTheDuplexFlag) {  // GW-1, GW-2
  std::vector<std::byte> plain, routed;
  encode(Hello{kSessionProtocolVersion, 5, "tcp:10.0.0.1:7"}, plain);
  encode(Hello{kSessionProtocolVersion, 6, "tcp:10.0.0.1:7", "tcp:10.0.0.2:9/a1", 0}, routed);
  encode(Hello{kSessionProtocolVersion, 0, "", "", kHelloReverse}, routed);
  auto a = decode_stream(plain, [] { return size_t(3); });
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(std::get<Hello>(a[0]).to, "");  // a Hello without the fields: three of them
  EXPECT_EQ(std::get<Hello>(a[0]).flags, 0u);
  auto b = decode_stream(routed, [] { return size_t(2); });
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(std::get<Hello>(b[0]).to, "tcp:10.0.0.2:9/a1");
  EXPECT_EQ(std::get<Hello>(b[0]).session_id, 6u);
  EXPECT_EQ(std::get<Hello>(b[1]).flags, kHelloReverse);
  EXPECT_EQ(std::get<Hello>(b[1]).listen_address, "");
}

// Many frames, small and large, in one stream.
std::pair<std::vector<std::byte>, std::vector<Envelope>> mixed_stream() {
  std::vector<std::byte> stream;
  std::vector<Envelope> sent;
  std::vector<std::byte> head;
  const size_t sizes[] = {0, 1, 100, FrameDecoder::kDirectReadMin - 1, FrameDecoder::kDirectReadMin,
                          70000, 1 << 20, 5};
  for (size_t i = 0; i < std::size(sizes); ++i) {
    Envelope e = sample({pattern(sizes[i], uint8_t(i)), pattern(i, 9), pattern(sizes[i] / 3, 3)});
    e.order_seq = i;
    head.clear();
    encode_data(i + 1, e, head);
    auto w = wire_bytes(head, e);
    stream.insert(stream.end(), w.begin(), w.end());
    sent.push_back(std::move(e));
  }
  return {std::move(stream), std::move(sent)};
}

void expect_stream(const std::vector<Message>& got, const std::vector<Envelope>& sent) {
  ASSERT_EQ(got.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    auto& d = std::get<Data>(got[i]);
    EXPECT_EQ(d.seq, i + 1);
    expect_same(d.envelope, sent[i]);
  }
}

TEST(WireFrame, DecodesTheSameFramesFedOneByteAtATime) {  // WI-2
  auto [stream, sent] = mixed_stream();
  // One byte at a time through feed(), and through prepare()/commit().
  FrameDecoder d(FrameLimits{});
  std::vector<Message> got;
  for (auto b : stream) {
    ASSERT_TRUE(d.feed({&b, 1}, [&](RawFrame&& f) { got.push_back(*decode(std::move(f))); }));
  }
  expect_stream(got, sent);
  expect_stream(decode_stream(stream, [] { return size_t(1); }), sent);
}

TEST(WireFrame, DecodesTheSameFramesUnderRandomChunkings) {  // WI-2
  auto [stream, sent] = mixed_stream();
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<size_t> small(1, 64), large(1, 200000);
    auto got = decode_stream(stream, [&] { return rng() % 2 ? small(rng) : large(rng); });
    expect_stream(got, sent);
  }
}

Result<bool> feed_one(std::span<const std::byte> bytes, FrameLimits limits = {}) {
  FrameDecoder d(limits);
  auto s = d.feed(bytes, [](RawFrame&&) {});
  if (!s) return std::unexpected(s.error());
  return d.mid_frame();
}

TEST(WireFrame, LargePartIsReadStraightIntoItsOwnAllocation) {  // WI-4
  Envelope e = sample({pattern(10, 1), pattern(3 << 20, 2)});
  std::vector<std::byte> head;
  encode_data(1, e, head);
  auto stream = wire_bytes(head, e);
  FrameDecoder d(FrameLimits{});
  std::vector<std::span<std::byte>> targets;
  RawFrame f;
  size_t at = 0;
  bool done = false;
  while (!done) {
    auto to = d.prepare();
    size_t n = std::min(to.size(), stream.size() - at);
    std::memcpy(to.data(), stream.data() + at, n);
    targets.push_back(to);
    d.commit(n);
    at += n;
    auto ready = d.next(f);
    ASSERT_TRUE(ready.has_value());
    done = *ready;
  }
  ASSERT_EQ(f.parts.size(), 2u);
  const Buffer& big = f.parts[1];
  EXPECT_EQ(0, std::memcmp(big.data(), e.parts[1].data(), big.size()));
  // One read into the buffer, then reads straight into the part, whose allocation doubles
  // from kBigPartFirstBytes as it fills (WI-6): 128 KiB, 256 KiB, ... 2 MiB, 3 MiB.
  EXPECT_EQ(targets.size(), 7u);
  for (size_t i = 2; i + 1 < targets.size(); ++i) {
    EXPECT_EQ(targets[i].size(), (size_t{64} << 10) << (i - 1)) << i;
  }
  // The last read lands inside the finished part.
  EXPECT_GE(targets.back().data(), big.data());
  EXPECT_EQ(targets.back().data() + targets.back().size(), big.data() + big.size());
}

// A Data head whose prefix claims `header_len` header bytes and whose table claims `parts`.
std::vector<std::byte> claimed_head(uint32_t header_len, std::vector<uint64_t> parts,
                                    FrameKind kind = FrameKind::kData) {
  std::vector<std::byte> b(table_end(parts.size()));
  std::memcpy(b.data(), "PDM", 3);
  b[3] = std::byte{kFrameVersion};
  b[4] = std::byte{uint8_t(kind)};
  b[6] = std::byte(parts.size() & 0xff);
  b[7] = std::byte(parts.size() >> 8);
  for (int i = 0; i < 4; ++i) b[8 + i] = std::byte((header_len >> (8 * i)) & 0xff);
  for (size_t p = 0; p < parts.size(); ++p) {
    for (int i = 0; i < 8; ++i) b[table_end(p) + i] = std::byte((parts[p] >> (8 * i)) & 0xff);
  }
  return b;
}

TEST(WireFrame, RefusesAHeaderOverItsKindsLimitFromThePrefixAlone) {  // WI-5
  // A Data header of 2 GiB - 1 against the 1 MiB default: refused from 12 bytes.
  auto r = feed_one(claimed_head(0x7fffffff, {}));
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(WireErrc::kHeaderTooLarge)) << r.error().to_string();
  EXPECT_NE(r.error().message.find("Data header of 2147483647 bytes exceeds the limit of 1048576"),
            std::string::npos)
      << r.error().message;
  // Control frames: small headers and no parts, whatever the frame limit allows.
  r = feed_one(claimed_head(kMaxControlHeaderBytes + 1, {}, FrameKind::kAck));
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(WireErrc::kHeaderTooLarge)) << r.error().to_string();
  r = feed_one(claimed_head(3, {1}, FrameKind::kHello));
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(WireErrc::kControlFrameParts)) << r.error().to_string();
  EXPECT_NE(r.error().message.find("a Hello frame carries 1 parts"), std::string::npos);
  // A configured header limit applies to Data.
  r = feed_one(claimed_head(101, {}), FrameLimits{.max_header_bytes = 100});
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(WireErrc::kHeaderTooLarge));
}

TEST(WireFrame, AClaimedHugeHeaderCostsWhatArrivedNotWhatItClaimed) {  // WI-6
  // The limits allow a 2 GiB header here; the peer sends its prefix and 100 bytes.
  FrameLimits limits{.max_header_bytes = 0x7fffffff};
  FrameDecoder d(limits);
  auto head = claimed_head(0x7fff0000, {});
  head.resize(head.size() + 100);
  ASSERT_TRUE(d.feed(head, [](RawFrame&&) {}).has_value());
  EXPECT_TRUE(d.mid_frame());
  EXPECT_LE(d.held_bytes(), 2 * FrameDecoder::kDefaultBufferBytes);
  // 1 MiB more arrives: the buffer grows with it, doubling, not to 2 GiB.
  std::vector<std::byte> more(1 << 20);
  ASSERT_TRUE(d.feed(more, [](RawFrame&&) {}).has_value());
  EXPECT_LE(d.held_bytes(), 3u << 20);
}

TEST(WireFrame, AClaimedHugePartCostsWhatArrivedNotWhatItClaimed) {  // WI-6
  Envelope e = sample({});
  std::vector<std::byte> stream;
  encode_data(1, e, stream);
  // Rewrite the head to announce one part of 2 GiB - 4 KiB.
  uint32_t header_len = uint32_t(stream.size() - kPrefixBytes);
  auto head = claimed_head(header_len, {(uint64_t{1} << 31) - 4096});
  head.insert(head.end(), stream.begin() + kPrefixBytes, stream.end());
  head.resize(head.size() + 10);  // 10 bytes of the part
  FrameDecoder d(FrameLimits{});
  ASSERT_TRUE(d.feed(head, [](RawFrame&&) {}).has_value());
  EXPECT_LE(d.held_bytes(), 2 * FrameDecoder::kDefaultBufferBytes);
  std::vector<std::byte> more(3 << 20);
  ASSERT_TRUE(d.feed(more, [](RawFrame&&) {}).has_value());
  EXPECT_LE(d.held_bytes(), FrameDecoder::kDefaultBufferBytes + (8u << 20));
  // Huge part counts are refused from the prefix: 65535 parts against the 1024 limit.
  auto r = feed_one(claimed_head(1, std::vector<uint64_t>(1)), FrameLimits{.max_parts = 0});
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(WireErrc::kTooManyParts));
  std::vector<std::byte> many(kPrefixBytes);
  std::memcpy(many.data(), "PDM\x01\x03\x00\xff\xff\x10\x00\x00\x00", kPrefixBytes);
  r = feed_one(many);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(WireErrc::kTooManyParts)) << r.error().to_string();
}


std::vector<std::byte> valid_ack() {
  std::vector<std::byte> b;
  encode(Ack{1}, b);
  return b;
}

TEST(WireFrame, RejectsGarbagePrefixesWithPreciseErrors) {  // WI-3
  auto bad = [](size_t at, uint8_t v) {
    auto b = valid_ack();
    b[at] = std::byte{v};
    return feed_one(b);
  };
  auto r = bad(0, 'X');
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(WireErrc::kBadMagic));
  EXPECT_NE(r.error().message.find("58 44 4d"), std::string::npos) << r.error().message;
  r = bad(3, 9);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(WireErrc::kBadVersion));
  EXPECT_EQ(r.error().message, "frame version 9, this build speaks 1");
  r = bad(4, 0);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(WireErrc::kBadKind));
  r = bad(4, 5);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(WireErrc::kBadKind));
  r = bad(5, 0x80);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(WireErrc::kBadFlags));
  // Plain text (an HTTP request on the port) is not a frame.
  r = feed_one(bytes_of("GET / HTTP/1.1\r\n\r\n"));
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(WireErrc::kBadMagic));
}

TEST(WireFrame, RejectsTooManyParts) {  // WI-3
  std::vector<Buffer> parts(9);
  Envelope e = sample(std::move(parts));
  std::vector<std::byte> head;
  encode_data(1, e, head);
  auto r = feed_one(head, FrameLimits{.max_parts = 8});
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(WireErrc::kTooManyParts));
  EXPECT_EQ(r.error().message, "frame has 9 parts, the limit is 8");
  EXPECT_TRUE(feed_one(head, FrameLimits{.max_parts = 9}).has_value());
}

TEST(WireFrame, RejectsOversizedFramesBeforeAllocating) {  // WI-3
  FrameLimits limits{.max_frame_bytes = 4096};
  // A part length of 2^62 would be an allocation failure if the decoder tried.
  std::vector<std::byte> head;
  {
    Envelope e = sample({pattern(1, 1)});
    encode_data(1, e, head);
    head[12 + 7] = std::byte{0x40};
  }
  auto r = feed_one(head, limits);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(WireErrc::kFrameTooLarge));
  EXPECT_NE(r.error().message.find("exceeds the limit of 4096 bytes"), std::string::npos)
      << r.error().message;
  // Part lengths that overflow size_t.
  head.clear();
  encode_data(1, sample({pattern(1, 1), pattern(1, 1)}), head);
  for (size_t i = 12; i < 28; ++i) head[i] = std::byte{0xff};
  r = feed_one(head, limits);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(WireErrc::kFrameTooLarge));
  EXPECT_NE(r.error().message.find("overflow"), std::string::npos);
  // A header length over the frame limit is refused from the 12-byte prefix alone (one over
  // its kind's header limit too: WI-5, kHeaderTooLarge).
  head = claimed_head(5000, {});
  r = feed_one(head, limits);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(WireErrc::kFrameTooLarge));
  // Exactly at the limit is fine.
  head.clear();
  Envelope e = sample({});
  encode_data(1, e, head);
  e.parts = {pattern(4096 - head.size() - kPartLenBytes, 0)};
  head.clear();
  encode_data(1, e, head);
  auto frame = wire_bytes(head, e);
  ASSERT_EQ(frame.size(), 4096u);
  EXPECT_TRUE(feed_one(frame, limits).has_value());
}

TEST(WireFrame, TruncatedFrameLeavesTheDecoderMidFrame) {
  Envelope e = sample({pattern(50000, 1)});
  std::vector<std::byte> head;
  encode_data(1, e, head);
  auto frame = wire_bytes(head, e);
  const size_t cuts[] = {1, kPrefixBytes, head.size() - 1, head.size() + 10, frame.size() - 1};
  for (size_t cut : cuts) {
    auto r = feed_one(std::span(frame).first(cut));
    ASSERT_TRUE(r.has_value());
    EXPECT_TRUE(*r) << "cut at " << cut;
  }
  auto r = feed_one(frame);
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(*r);
}

}  // namespace
}  // namespace podium::wire
