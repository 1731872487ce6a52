#include "podium/wire/message.h"

#include <cstring>
#include <limits>
#include <msgpack/pack.hpp>
#include <string_view>

namespace podium::wire {
namespace {

using Packer = msgpack::packer<HeadWriter>;

void pack_str(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

// A strict reader for the msgpack subset the headers use (unsigned ints, str, array, map).
// It neither throws nor allocates: strings are views into the header.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> b)
      : p_(reinterpret_cast<const uint8_t*>(b.data())), end_(p_ + b.size()) {}

  bool uint(uint64_t& v) {
    if (p_ == end_) return false;
    uint8_t t = *p_;
    if (t <= 0x7f) {
      v = t;
      ++p_;
      return true;
    }
    switch (t) {
      case 0xcc: return fixed(1, v);
      case 0xcd: return fixed(2, v);
      case 0xce: return fixed(4, v);
      case 0xcf: return fixed(8, v);
    }
    return false;
  }

  bool str(std::string_view& s) {
    if (p_ == end_) return false;
    uint8_t t = *p_;
    uint64_t n;
    if ((t & 0xe0) == 0xa0) {
      n = t & 0x1f;
      ++p_;
    } else if (!(t == 0xd9 ? fixed(1, n) : t == 0xda ? fixed(2, n) : t == 0xdb && fixed(4, n))) {
      return false;
    }
    if (size_t(end_ - p_) < n) return false;
    s = {reinterpret_cast<const char*>(p_), size_t(n)};
    p_ += n;
    return true;
  }

  bool array(uint64_t& n) { return container(0x90, 0xdc, n); }
  bool map(uint64_t& n) { return container(0x80, 0xde, n); }
  bool done() const { return p_ == end_; }
  size_t remaining() const { return size_t(end_ - p_); }

 private:
  // Reads the big-endian integer of `width` bytes after the type byte.
  bool fixed(size_t width, uint64_t& v) {
    if (size_t(end_ - p_) < 1 + width) return false;
    v = 0;
    for (size_t i = 1; i <= width; ++i) v = (v << 8) | p_[i];
    p_ += 1 + width;
    return true;
  }
  bool container(uint8_t fix, uint8_t t16, uint64_t& n) {
    if (p_ == end_) return false;
    uint8_t t = *p_;
    if ((t & 0xf0) == fix) {
      n = t & 0x0f;
      ++p_;
      return true;
    }
    return t == t16 ? fixed(2, n) : t == t16 + 1 && fixed(4, n);
  }

  const uint8_t* p_;
  const uint8_t* end_;
};

std::unexpected<Error> malformed(std::string_view frame, std::string_view what) {
  std::string msg = "malformed ";
  msg += frame;
  msg += " header: ";
  msg += what;
  return std::unexpected(make_error(WireErrc::kMalformedHeader, std::move(msg)));
}

Result<Message> decode_hello(Reader& r) {
  Hello m;
  uint64_t n, version;
  std::string_view addr;
  if (!r.array(n) || (n != 3 && n != 5 && n != 7)) {
    return malformed("Hello", "expected an array of 3, 5 or 7");
  }
  if (!r.uint(version) || version > std::numeric_limits<uint32_t>::max()) {
    return malformed("Hello", "bad protocol_version");
  }
  if (!r.uint(m.session_id)) return malformed("Hello", "bad session_id");
  if (!r.str(addr)) return malformed("Hello", "bad listen_address");
  m.protocol_version = static_cast<uint32_t>(version);
  m.listen_address = addr;
  if (n >= 5) {
    std::string_view to;
    uint64_t flags;
    if (!r.str(to)) return malformed("Hello", "bad to");
    if (!r.uint(flags) || flags > (kHelloReverse | kHelloLend)) {
      return malformed("Hello", "bad flags");
    }
    // WI-8: the probe comes with kHelloLend and only with it.
    if (((flags & kHelloLend) != 0) != (n == 7)) return malformed("Hello", "bad lend probe");
    m.to = to;
    m.flags = static_cast<uint32_t>(flags);
  }
  if (n == 7 && (!r.uint(m.probe_addr) || !r.uint(m.probe_value))) {
    return malformed("Hello", "bad lend probe");
  }
  return m;
}

// HelloAck and Ack: an array holding one seq.
Result<uint64_t> decode_seq(Reader& r, std::string_view frame) {
  uint64_t n, seq;
  if (!r.array(n) || n != 1 || !r.uint(seq)) return malformed(frame, "expected [seq]");
  return seq;
}

Result<Message> decode_hello_ack(Reader& r) {
  uint64_t n, seq, flags = 0;
  if (!r.array(n) || (n != 1 && n != 2) || !r.uint(seq)) {
    return malformed("HelloAck", "expected [seq] or [seq, flags]");
  }
  if (n == 2 && (!r.uint(flags) || flags != kAckPull)) return malformed("HelloAck", "bad flags");
  return HelloAck{seq, static_cast<uint32_t>(flags)};
}

Result<Message> decode_data(Reader& r, std::vector<Buffer>&& parts) {
  Data m;
  Envelope& e = m.envelope;
  uint64_t n, kind, headers;
  std::string_view dest, sender;
  if (!r.array(n) || (n != 7 && n != 8)) return malformed("Data", "expected an array of 7 or 8");
  if (!r.uint(m.seq)) return malformed("Data", "bad seq");
  if (!r.uint(kind) || kind > 0xff) return malformed("Data", "bad kind");
  if (!r.str(dest)) return malformed("Data", "bad dest");
  if (!r.str(sender)) return malformed("Data", "bad sender");
  if (!r.uint(e.order_stream)) return malformed("Data", "bad order_stream");
  if (!r.uint(e.order_seq)) return malformed("Data", "bad order_seq");
  if (!r.map(headers) || headers > r.remaining() / 2) return malformed("Data", "bad headers");
  e.kind = static_cast<uint8_t>(kind);
  e.dest = dest;
  e.sender = sender;
  e.headers.reserve(headers);
  for (uint64_t i = 0; i < headers; ++i) {
    std::string_view k, v;
    if (!r.str(k) || !r.str(v)) return malformed("Data", "bad header entry");
    e.headers.emplace_back(k, v);
  }
  if (n == 8) {
    // WI-8: lent parts, each an empty part of the table, in increasing index order.
    uint64_t count;
    if (!r.array(count) || count == 0 || count > parts.size()) return malformed("Data", "bad lent");
    m.lent.reserve(count);
    for (uint64_t i = 0; i < count; ++i) {
      uint64_t k, index, fd = 0;
      LentPart l;
      if (!r.array(k) || (k != 3 && k != 6) || !r.uint(index) || !r.uint(l.addr) ||
          !r.uint(l.len) || index >= parts.size() || !parts[index].empty() || l.len == 0 ||
          (!m.lent.empty() && index <= m.lent.back().index)) {
        return malformed("Data", "bad lent part");
      }
      if (k == 6) {  // WI-9: the shared block it lies in
        if (!r.uint(fd) || fd > uint64_t(std::numeric_limits<int32_t>::max()) || !r.uint(l.ino) || !r.uint(l.gen)) {
          return malformed("Data", "bad shared part");
        }
        l.fd = static_cast<int32_t>(fd);
      }
      l.index = static_cast<uint32_t>(index);
      m.lent.push_back(l);
    }
  }
  e.parts = std::move(parts);
  return m;
}

}  // namespace

// msgpack's largest encodings: 9-byte uint, 5-byte str/array/map headers.
constexpr size_t kUintMax = 9;
constexpr size_t kHeadMax = 5;

void encode(const Hello& m, std::vector<std::byte>& out) {
  bool routed = !m.to.empty() || m.flags != 0;
  bool lend = (m.flags & kHelloLend) != 0;
  HeadWriter w(out, FrameKind::kHello, {},
               1 + 5 * kUintMax + 2 * kHeadMax + m.listen_address.size() + m.to.size());
  Packer pk(w);
  pk.pack_array(lend ? 7 : routed ? 5 : 3);
  pk.pack_uint32(m.protocol_version);
  pk.pack_uint64(m.session_id);
  pack_str(pk, m.listen_address);
  if (routed) {
    pack_str(pk, m.to);
    pk.pack_uint32(m.flags);
  }
  if (lend) {
    pk.pack_uint64(m.probe_addr);
    pk.pack_uint64(m.probe_value);
  }
  w.finish();
}

void encode(const HelloAck& m, std::vector<std::byte>& out) {
  HeadWriter w(out, FrameKind::kHelloAck, {}, 1 + 2 * kUintMax);
  Packer pk(w);
  pk.pack_array(m.flags != 0 ? 2 : 1).pack_uint64(m.delivered_seq);
  if (m.flags != 0) pk.pack_uint32(m.flags);
  w.finish();
}

void encode(const Ack& m, std::vector<std::byte>& out) {
  HeadWriter w(out, FrameKind::kAck, {}, 1 + kUintMax);
  Packer(w).pack_array(1).pack_uint64(m.seq);
  w.finish();
}

void encode_data(uint64_t seq, const Envelope& env, std::vector<std::byte>& out) {
  encode_data(seq, env, out, 0);
}

void encode_data(uint64_t seq, const Envelope& env, std::vector<std::byte>& out,
                 size_t lend_min) {
  size_t lent = 0;
  for (const Buffer& p : env.parts) lent += lends(p, lend_min) ? 1 : 0;
  size_t hint = 1 + 3 * kUintMax + 2 + 3 * kHeadMax + env.dest.size() + env.sender.size() +
                (lent > 0 ? kHeadMax + lent * (1 + 6 * kUintMax) : 0);
  for (const auto& [k, v] : env.headers) hint += 2 * kHeadMax + k.size() + v.size();
  HeadWriter w(out, FrameKind::kData, env.parts, hint);
  Packer pk(w);
  pk.pack_array(lent > 0 ? 8 : 7);
  pk.pack_uint64(seq);
  pk.pack_uint8(env.kind);
  pack_str(pk, env.dest);
  pack_str(pk, env.sender);
  pk.pack_uint64(env.order_stream);
  pk.pack_uint64(env.order_seq);
  pk.pack_map(static_cast<uint32_t>(env.headers.size()));
  for (const auto& [k, v] : env.headers) {
    pack_str(pk, k);
    pack_str(pk, v);
  }
  if (lent > 0) {
    pk.pack_array(static_cast<uint32_t>(lent));
    for (size_t i = 0; i < env.parts.size(); ++i) {
      const Buffer& p = env.parts[i];
      if (!lends(p, lend_min)) continue;
      w.zero_part(i);
      const SharedRef* shared = nullptr;
      for (const SharedRef& s : env.shared) {
        if (s.index == i) shared = &s;
      }
      pk.pack_array(shared != nullptr ? 6 : 3);
      pk.pack_uint64(i);
      pk.pack_uint64(reinterpret_cast<uintptr_t>(p.data()));
      pk.pack_uint64(p.size());
      if (shared != nullptr) {  // WI-9
        pk.pack_uint64(uint64_t(shared->fd));
        pk.pack_uint64(shared->ino);
        pk.pack_uint64(shared->gen);
      }
    }
  }
  w.finish();
}

size_t data_frame_bound(const Envelope& env, size_t* header_bound) {
  constexpr size_t kStrMax = std::numeric_limits<uint32_t>::max();
  // msgpack worst cases: 5-byte str/map/array headers, 9-byte uints.
  size_t n = 5 + 9 + 2 + 9 + 9 + 5;
  bool fits = env.dest.size() <= kStrMax && env.sender.size() <= kStrMax;
  n += 5 + env.dest.size() + 5 + env.sender.size();
  for (const auto& [k, v] : env.headers) {
    fits = fits && k.size() <= kStrMax && v.size() <= kStrMax;
    n += 10 + k.size() + v.size();
  }
  // WI-8: a lent part's descriptor, for every part a link might lend.
  size_t lendable = 0;
  for (const auto& p : env.parts) lendable += p.size() >= kMinLendBytes ? 1 : 0;
  if (lendable > 0) n += 5 + lendable * (1 + 6 * 9);
  if (header_bound) *header_bound = fits ? n : std::numeric_limits<size_t>::max();
  n += table_end(env.parts.size());
  for (const auto& p : env.parts) n += p.size();
  return fits ? n : std::numeric_limits<size_t>::max();
}

Result<Message> decode(RawFrame&& frame) {
  Reader r(frame.header);
  Result<Message> m;
  std::string_view name;
  switch (frame.kind) {
    case FrameKind::kHello:
      name = "Hello";
      m = decode_hello(r);
      break;
    case FrameKind::kHelloAck:
      name = "HelloAck";
      m = decode_hello_ack(r);
      break;
    case FrameKind::kAck:
      name = "Ack";
      if (auto seq = decode_seq(r, name); seq) {
        m = Ack{*seq};
      } else {
        m = std::unexpected(std::move(seq.error()));
      }
      break;
    case FrameKind::kData:
      name = "Data";
      m = decode_data(r, std::move(frame.parts));
      break;
  }
  if (!m) return m;
  if (!r.done()) return malformed(name, "trailing bytes");
  if (frame.kind != FrameKind::kData && !frame.parts.empty()) {
    return malformed(name, "a control frame carries " + std::to_string(frame.parts.size()) +
                               " parts");
  }
  return m;
}

}  // namespace podium::wire
