// podium::wire frames — the byte format of every socket link (layout: docs/wire.md).
//
// A frame is a fixed 12-byte little-endian prefix, a table of part lengths, a msgpack header
// and N byte parts:
//
//   "PDM" | version u8 | kind u8 | flags u8 | part_count u16 | header_len u32 |
//   part_len u64 x part_count | header | part 0 | ... | part N-1
//
// The sender writes the head (prefix, table, header) from one small reused buffer and each
// part from its own memory (writev); the receiver reads a large part straight into its own
// allocation.
//
// Threads: a FrameDecoder belongs to one reader at a time; it is not thread-safe.
//
// Invariants (tests name them):
//   WI-1 Encoding never copies a part: the head is the only encoded byte range, each part is
//        sent from the caller's Buffer.
//   WI-2 The decoder yields the same frames however the byte stream is split into reads.
//   WI-3 The decoder checks a frame's total size against FrameLimits before allocating for
//        it. An oversized frame, bad magic/version/kind/flags, too many parts or overflowing
//        lengths is an error naming the field; the stream is unusable after an error.
//   WI-4 Each part lands in its own allocation. While kDirectReadMin or more bytes of a part
//        are still to come, prepare() points reads straight into that allocation.
//   WI-5 Lengths are checked before they are believed: a header longer than its kind allows
//        (FrameLimits::max_header_bytes for Data, kMaxControlHeaderBytes for Hello, HelloAck
//        and Ack) or a control frame with parts is an error from the 12-byte prefix alone.
//   WI-6 A peer costs what it sent, not what it claimed: the decoder's memory grows with the
//        bytes that arrive (the read buffer and a part over kEagerPartBytes grow
//        geometrically as they fill), so a frame announcing 2 GiB that sends 12 bytes holds
//        about kDefaultBufferBytes, never the announced size.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "podium/base/buffer.h"
#include "podium/base/error.h"

namespace podium::wire {

enum class WireErrc : uint16_t {
  kBadMagic = 100,
  kBadVersion = 101,
  kBadKind = 102,
  kBadFlags = 103,
  kTooManyParts = 104,
  kFrameTooLarge = 105,
  kMalformedHeader = 106,
  kHeaderTooLarge = 107,     // WI-5
  kControlFrameParts = 108,  // WI-5: Hello, HelloAck and Ack carry no parts
};
constexpr Subsystem subsystem_of(WireErrc) { return Subsystem::kWire; }

enum class FrameKind : uint8_t { kHello = 1, kHelloAck = 2, kData = 3, kAck = 4 };

inline constexpr uint8_t kFrameVersion = 1;
inline constexpr size_t kPrefixBytes = 12;
inline constexpr size_t kPartLenBytes = 8;
inline constexpr uint32_t kMaxPartsLimit = 0xffff;  // part_count is a u16
// Hello, HelloAck and Ack headers: a few integers and one address (WI-5).
inline constexpr uint32_t kMaxControlHeaderBytes = 4096;

struct FrameLimits {
  size_t max_frame_bytes = size_t{1} << 31;  // prefix + table + header + parts
  uint32_t max_parts = 1024;                 // at most kMaxPartsLimit
  // A Data frame's msgpack header (addresses and a few string headers): far below the frame
  // limit, since the decoder holds a whole head in one buffer (WI-5).
  uint32_t max_header_bytes = 1u << 20;
};

// Bytes of the prefix and part table for `part_count` parts.
constexpr size_t table_end(size_t part_count) { return kPrefixBytes + kPartLenBytes * part_count; }

// Appends a frame head to `out`: construct, write the msgpack header through write() (the
// msgpack::packer stream interface), then finish(). The frame on the wire is `out[start..]`
// followed by the parts. `header_hint` is the expected header size: room is made for it at
// once, so that writing the header does not grow `out` piece by piece.
class HeadWriter {
 public:
  HeadWriter(std::vector<std::byte>& out, FrameKind kind, std::span<const Buffer> parts,
             size_t header_hint);
  void write(const char* p, size_t n) {
    if (n > out_.size() - end_) out_.resize(end_ + n);
    std::memcpy(out_.data() + end_, p, n);
    end_ += n;
  }
  void finish();
  // A part whose bytes do not follow the head (WI-8: lent, pulled by the receiver): its
  // table entry says 0 bytes.
  void zero_part(size_t i);

 private:
  std::vector<std::byte>& out_;
  size_t start_;
  size_t header_start_;
  size_t end_;  // out_[end_..] is room not yet written
};

// One decoded frame. `header` points into the decoder and stays valid until the decoder's
// next prepare(), commit() or reset().
struct RawFrame {
  FrameKind kind = FrameKind::kData;
  std::span<const std::byte> header;
  std::vector<Buffer> parts;
};

// Incremental decoder: the reader asks prepare() where to put bytes, reports them with
// commit(), and drains complete frames with next() until it returns false.
class FrameDecoder {
 public:
  static constexpr size_t kDefaultBufferBytes = 64 * 1024;
  static constexpr size_t kDirectReadMin = 16 * 1024;
  // A part up to this size is allocated whole once its length is known; a larger one starts
  // at kBigPartFirstBytes (or what already arrived) and doubles as its bytes arrive (WI-6).
  static constexpr size_t kEagerPartBytes = 1 << 20;
  static constexpr size_t kBigPartFirstBytes = 64 * 1024;

  explicit FrameDecoder(FrameLimits limits, size_t buffer_bytes = kDefaultBufferBytes);
  FrameDecoder(FrameDecoder&&) = default;
  FrameDecoder& operator=(FrameDecoder&&) = default;

  // Bytes the decoder holds for the stream now (read buffer, saved header, part being
  // filled): what WI-6 bounds. For tests and the fuzz targets.
  size_t held_bytes() const { return buf_.capacity() + saved_.capacity() + part_cap_; }

  // Where the next read should write (never empty): the free tail of the read buffer, or
  // the unfilled rest of a large part's own allocation (WI-4). Call after next() returned
  // false.
  std::span<std::byte> prepare();
  // `n` bytes were written at the start of the span returned by prepare().
  void commit(size_t n);
  // True with `out` filled when a whole frame is buffered, false when more bytes are needed,
  // an error when the stream is malformed (WI-3).
  [[nodiscard]] Result<bool> next(RawFrame& out);

  // Copies `bytes` in through prepare()/commit() and calls on_frame(RawFrame&&) for each
  // complete frame (for tests and in-memory streams).
  template <class OnFrame>
  [[nodiscard]] Status feed(std::span<const std::byte> bytes, OnFrame&& on_frame);

  // True when bytes of an unfinished frame are held: a close now truncates a frame.
  bool mid_frame() const { return state_ != State::kPrefix || end_ != begin_; }
  void reset();

 private:
  enum class State : uint8_t { kPrefix, kTable, kHeader, kParts };

  Status parse_prefix();
  Status parse_table();
  // True once every part is in; an error when a part's memory cannot be had.
  Result<bool> read_parts();
  std::span<const std::byte> header() const;
  // The part being filled, in whichever allocation holds it.
  std::byte* part_data() const { return part_ ? part_.get() : big_.get(); }
  // Grows big_ to at least `need` bytes (at most the part's length), doubling; false when the
  // memory cannot be had.
  bool grow_big(size_t need);
  struct Free {
    void operator()(std::byte* p) const;
  };

  FrameLimits limits_;
  size_t min_buffer_;
  std::vector<std::byte> buf_;  // read buffer: [begin_, end_) holds unparsed bytes
  size_t begin_ = 0;
  size_t end_ = 0;

  // The frame being decoded.
  State state_ = State::kPrefix;
  FrameKind kind_ = FrameKind::kData;
  uint32_t part_count_ = 0;
  uint32_t header_len_ = 0;
  size_t head_len_ = 0;       // prefix + table + header
  size_t frame_ = 0;          // offset of the frame's head in buf_ until it moves to saved_
  bool header_saved_ = false; // the header was copied to saved_ to free the read buffer
  std::vector<std::byte> saved_;
  std::vector<uint64_t> part_lens_;
  std::vector<Buffer> parts_;
  // The part being filled, part_filled_ of part_lens_[i] bytes in: part_ when it is at most
  // kEagerPartBytes, else big_ (malloc'd, grown by realloc, which moves pages rather than
  // bytes for large blocks), with part_cap_ bytes of room in either.
  std::shared_ptr<std::byte[]> part_;
  std::unique_ptr<std::byte, Free> big_;
  size_t part_cap_ = 0;
  size_t part_filled_ = 0;
  bool direct_ = false;  // the span from prepare() is the rest of part_
};

template <class OnFrame>
Status FrameDecoder::feed(std::span<const std::byte> bytes, OnFrame&& on_frame) {
  for (;;) {
    RawFrame frame;
    for (;;) {
      auto ready = next(frame);
      if (!ready) return std::unexpected(std::move(ready.error()));
      if (!*ready) break;
      on_frame(std::move(frame));
    }
    if (bytes.empty()) return ok();
    std::span<std::byte> to = prepare();
    size_t n = std::min(to.size(), bytes.size());
    std::copy_n(bytes.data(), n, to.data());
    commit(n);
    bytes = bytes.subspan(n);
  }
}

}  // namespace podium::wire
