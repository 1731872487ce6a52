// Fuzz target: the frame decoder (wire/frame.h) over a byte stream split into reads as the
// first input byte says, then each frame's message decode (wire/message.h). Checks WI-2
// (a Data frame decodes to what it re-encodes to) and WI-6 (the decoder holds about what it
// was fed, never what a length claimed).
#include <cstring>

#include "fuzz.h"
#include "podium/wire/frame.h"
#include "podium/wire/message.h"

using namespace podium;
using namespace podium::wire;

const char* const podium::fuzz::kTargetName = "frame";

namespace {

void check_round_trip(const Data& d) {
  std::vector<std::byte> head;
  encode_data(d.seq, d.envelope, head);
  for (const Buffer& p : d.envelope.parts) {
    head.insert(head.end(), p.span().begin(), p.span().end());
  }
  FrameDecoder again(FrameLimits{});
  int frames = 0;
  auto s = again.feed(head, [&](RawFrame&& f) {
    ++frames;
    auto m = decode(std::move(f));
    PODIUM_FUZZ_CHECK(m.has_value());
    auto* d2 = std::get_if<Data>(&*m);
    PODIUM_FUZZ_CHECK(d2 && d2->seq == d.seq);
    const Envelope &a = d.envelope, &b = d2->envelope;
    PODIUM_FUZZ_CHECK(a.kind == b.kind && a.dest == b.dest && a.sender == b.sender &&
                      a.order_stream == b.order_stream && a.order_seq == b.order_seq &&
                      a.headers == b.headers && a.parts.size() == b.parts.size());
    for (size_t i = 0; i < a.parts.size(); ++i) {
      PODIUM_FUZZ_CHECK(a.parts[i].size() == b.parts[i].size());
      PODIUM_FUZZ_CHECK(a.parts[i].size() == 0 ||
                        std::memcmp(a.parts[i].data(), b.parts[i].data(), a.parts[i].size()) == 0);
    }
  });
  PODIUM_FUZZ_CHECK(s.has_value() && frames == 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  uint8_t mode = data[0];
  ++data;
  --size;
  FrameLimits limits;  // the defaults a Net uses
  if (mode & 1) {
    limits = FrameLimits{.max_frame_bytes = 1 << 16, .max_parts = 4, .max_header_bytes = 512};
  }
  size_t buffer = (mode & 2) ? 4096 : FrameDecoder::kDefaultBufferBytes;
  size_t chunk = (mode >> 2) ? size_t(mode >> 2) : size;  // bytes per read
  FrameDecoder d(limits, buffer);
  size_t fed = 0;
  for (;;) {
    RawFrame f;
    for (;;) {
      auto ready = d.next(f);
      if (!ready) return 0;  // a refused stream: the channel closes the connection
      if (!*ready) break;
      auto m = decode(std::move(f));
      if (!m) return 0;
      if (auto* dm = std::get_if<Data>(&*m)) check_round_trip(*dm);
    }
    // WI-6: the read buffer grows by doubling with what arrived, a part piece likewise (or
    // is at most kEagerPartBytes), and a saved header is at most what arrived.
    size_t bound = 2 * std::max(buffer, table_end(limits.max_parts)) + 4 * fed +
                   FrameDecoder::kEagerPartBytes + FrameDecoder::kBigPartFirstBytes;
    PODIUM_FUZZ_CHECK(d.held_bytes() <= bound);
    if (fed == size) return 0;
    auto to = d.prepare();
    PODIUM_FUZZ_CHECK(!to.empty());
    size_t n = std::min({to.size(), size - fed, chunk});
    std::memcpy(to.data(), data + fed, n);
    d.commit(n);
    fed += n;
  }
}

std::vector<podium::fuzz::Input> podium::fuzz::seeds() {
  std::vector<Input> out;
  auto with_mode = [&](uint8_t mode, const std::vector<std::byte>& stream) {
    Input in{mode};
    auto b = bytes_of(stream);
    in.insert(in.end(), b.begin(), b.end());
    out.push_back(std::move(in));
  };
  std::vector<std::byte> s;
  encode(Hello{kSessionProtocolVersion, 77, "unix:/run/podium/a.sock"}, s);
  Envelope e;
  e.kind = 1;
  e.dest = "proc[1].actor[0].port[7]";
  e.sender = "proc[0].actor[0]";
  e.order_stream = 12345;
  e.order_seq = 3;
  e.headers = {{"reply", "unix:/x.sock#p1"}};
  std::string payload(40, 'p');
  e.parts = {Buffer::from_string(payload), Buffer{}, Buffer::from_string(std::string(300, 'q'))};
  encode_data(1, e, s);
  for (const Buffer& p : e.parts) s.insert(s.end(), p.span().begin(), p.span().end());
  e.parts.clear();
  e.headers.clear();
  encode_data(2, e, s);
  encode(Ack{2}, s);
  encode(HelloAck{1}, s);
  for (uint8_t mode : {0, 1, 2, 5, 4 * 7, 4 * 1 + 3}) with_mode(mode, s);
  std::vector<std::byte> ack;
  encode(Ack{9}, ack);
  with_mode(0, ack);
  // A part over kEagerPartBytes, cut short: the growing path (WI-6) and direct reads (WI-4).
  std::vector<std::byte> big;
  e.parts = {Buffer::from_string(std::string(3 << 20, 'b'))};
  encode_data(3, e, big);
  big.resize(big.size() + (150 << 10), std::byte{'b'});
  with_mode(0, big);
  with_mode(4 * 60, big);
  return out;
}
