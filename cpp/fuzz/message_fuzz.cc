// Fuzz target: the strict msgpack header reader of wire/message.cc, given a frame kind and a
// header directly (no frame decoder in front). A Data header that decodes must re-encode to a
// header that decodes to the same fields.
#include "fuzz.h"
#include "podium/wire/message.h"

using namespace podium;
using namespace podium::wire;

const char* const podium::fuzz::kTargetName = "message";

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  RawFrame f;
  f.kind = FrameKind(1 + data[0] % 4);
  f.header = std::span(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  if (data[0] & 0x80) f.parts = {Buffer::from_string("part")};
  auto m = decode(std::move(f));
  if (!m) return 0;
  if (auto* d = std::get_if<Data>(&*m)) {
    std::vector<std::byte> head;
    encode_data(d->seq, d->envelope, head);
    RawFrame g;
    g.kind = FrameKind::kData;
    size_t table = table_end(d->envelope.parts.size());
    g.header = std::span(head).subspan(table);
    g.parts = d->envelope.parts;
    auto again = decode(std::move(g));
    PODIUM_FUZZ_CHECK(again.has_value());
    auto* d2 = std::get_if<Data>(&*again);
    PODIUM_FUZZ_CHECK(d2 && d2->seq == d->seq && d2->envelope.dest == d->envelope.dest &&
                      d2->envelope.sender == d->envelope.sender &&
                      d2->envelope.headers == d->envelope.headers &&
                      d2->envelope.kind == d->envelope.kind &&
                      d2->envelope.order_seq == d->envelope.order_seq &&
                      d2->envelope.order_stream == d->envelope.order_stream);
  }
  return 0;
}

std::vector<podium::fuzz::Input> podium::fuzz::seeds() {
  std::vector<Input> out;
  auto header_of = [&](uint8_t kind, const std::vector<std::byte>& frame, size_t parts) {
    Input in{uint8_t(kind - 1)};
    auto b = bytes_of(std::span(frame).subspan(table_end(parts)));
    in.insert(in.end(), b.begin(), b.end());
    out.push_back(std::move(in));
  };
  std::vector<std::byte> f;
  encode(Hello{kSessionProtocolVersion, ~uint64_t(0), "tcp:10.0.0.7:7000"}, f);
  header_of(1, f, 0);
  f.clear();
  encode(HelloAck{300}, f);
  header_of(2, f, 0);
  f.clear();
  Envelope e;
  e.kind = 3;
  e.dest = "proc[1].actor[0].port[7]";
  e.sender = std::string(40, 's');
  e.headers = {{"reply", "unix:/x.sock#p1"}, {"runs", "1"}, {"", ""}};
  e.order_stream = 1ull << 40;
  e.order_seq = 70000;
  e.parts = {Buffer::from_string("x")};
  encode_data(1ull << 33, e, f);
  header_of(3, f, 1);
  f.clear();
  encode(Ack{5}, f);
  header_of(4, f, 0);
  return out;
}
