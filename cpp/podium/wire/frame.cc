#include "podium/wire/frame.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <string>

namespace podium::wire {
namespace {

constexpr std::byte kMagic[3] = {std::byte{'P'}, std::byte{'D'}, std::byte{'M'}};
// Below this much free space at the tail, prepare() moves unparsed bytes to the front.
constexpr size_t kMinFree = 4096;

template <class T>
void store_le(std::byte* at, T v) {
  if constexpr (std::endian::native == std::endian::big) v = std::byteswap(v);
  std::memcpy(at, &v, sizeof v);
}

template <class T>
T load_le(const std::byte* at) {
  T v;
  std::memcpy(&v, at, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = std::byteswap(v);
  return v;
}

Buffer own(std::shared_ptr<std::byte[]> bytes, size_t size) {
  const std::byte* data = bytes.get();
  return Buffer::received(std::shared_ptr<const void>(std::move(bytes), data), data, size);
}

std::string hex(const std::byte* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (i) out += ' ';
    out += kDigits[std::to_integer<int>(p[i]) >> 4];
    out += kDigits[std::to_integer<int>(p[i]) & 15];
  }
  return out;
}

const char* kind_name(FrameKind k) {
  switch (k) {
    case FrameKind::kHello: return "Hello";
    case FrameKind::kHelloAck: return "HelloAck";
    case FrameKind::kData: return "Data";
    case FrameKind::kAck: return "Ack";
  }
  return "?";
}

}  // namespace

void FrameDecoder::Free::operator()(std::byte* p) const { std::free(p); }

HeadWriter::HeadWriter(std::vector<std::byte>& out, FrameKind kind, std::span<const Buffer> parts,
                       size_t header_hint)
    : out_(out),
      start_(out.size()),
      header_start_(start_ + table_end(parts.size())),
      end_(header_start_) {
  out_.resize(header_start_ + header_hint);
  std::byte* p = out_.data() + start_;
  std::memcpy(p, kMagic, 3);
  p[3] = std::byte{kFrameVersion};
  p[4] = std::byte{static_cast<uint8_t>(kind)};
  p[5] = std::byte{0};
  store_le(p + 6, static_cast<uint16_t>(parts.size()));
  for (size_t i = 0; i < parts.size(); ++i) {
    store_le(p + table_end(i), static_cast<uint64_t>(parts[i].size()));
  }
}

void HeadWriter::zero_part(size_t i) { store_le(out_.data() + start_ + table_end(i), uint64_t{0}); }

void HeadWriter::finish() {
  out_.resize(end_);
  store_le(out_.data() + start_ + 8, static_cast<uint32_t>(end_ - header_start_));
}

FrameDecoder::FrameDecoder(FrameLimits limits, size_t buffer_bytes)
    : limits_(limits),
      min_buffer_(std::max(buffer_bytes, table_end(limits.max_parts))),
      buf_(min_buffer_) {}

void FrameDecoder::reset() {
  begin_ = end_ = 0;
  state_ = State::kPrefix;
  header_saved_ = false;
  parts_.clear();
  part_.reset();
  big_.reset();
  part_cap_ = 0;
}

std::span<const std::byte> FrameDecoder::header() const {
  if (header_saved_) return saved_;
  return {buf_.data() + frame_ + table_end(part_count_), header_len_};
}

std::span<std::byte> FrameDecoder::prepare() {
  direct_ = false;
  if (state_ == State::kParts && part_data() && begin_ == end_) {
    size_t len = part_lens_[parts_.size()];
    if (len - part_filled_ >= kDirectReadMin) {
      // A big part grows before the read when its room runs short (WI-6); should that fail,
      // the read goes to the buffer and read_parts() reports it.
      if (big_ && part_cap_ - part_filled_ < kDirectReadMin) {
        (void)grow_big(part_filled_ + kDirectReadMin);
      }
      if (part_cap_ > part_filled_) {
        direct_ = true;
        return {part_data() + part_filled_, part_cap_ - part_filled_};
      }
    }
  }
  // In the head states the whole head must become contiguous in buf_ (its size was checked
  // against the limits by parse_prefix/parse_table before we get here).
  size_t pending = end_ - begin_;
  size_t need = pending + 1;
  if (state_ == State::kTable) need = std::max(need, table_end(part_count_));
  if (state_ == State::kHeader) need = std::max(need, head_len_);
  if (begin_ > 0 && (pending == 0 || buf_.size() - end_ < std::max(kMinFree, need - pending))) {
    if (state_ == State::kParts && !header_saved_) {
      auto h = header();
      saved_.assign(h.begin(), h.end());
      header_saved_ = true;
    }
    std::memmove(buf_.data(), buf_.data() + begin_, pending);
    begin_ = 0;
    end_ = pending;
  }
  if (end_ == 0 && state_ == State::kPrefix && buf_.size() > min_buffer_) {
    buf_ = std::vector<std::byte>(min_buffer_);  // give back the room a huge head needed
  }
  if (buf_.size() < need && buf_.size() - end_ < kMinFree) {
    // WI-6: the buffer grows with the bytes that arrived (doubling once its tail is full),
    // not to the size the head claims.
    buf_.resize(std::min(need, std::max(2 * buf_.size(), end_ + kMinFree)));
  }
  return {buf_.data() + end_, buf_.size() - end_};
}

void FrameDecoder::commit(size_t n) {
  if (direct_) {
    part_filled_ += n;
  } else {
    end_ += n;
  }
  direct_ = false;
}

Status FrameDecoder::parse_prefix() {
  const std::byte* p = buf_.data() + begin_;
  if (std::memcmp(p, kMagic, 3) != 0) {
    return std::unexpected(
        make_error(WireErrc::kBadMagic, "bad frame magic " + hex(p, 3) + " (expected \"PDM\")"));
  }
  if (auto v = std::to_integer<uint8_t>(p[3]); v != kFrameVersion) {
    return std::unexpected(make_error(WireErrc::kBadVersion,
                                      "frame version " + std::to_string(v) +
                                          ", this build speaks " + std::to_string(kFrameVersion)));
  }
  auto kind = std::to_integer<uint8_t>(p[4]);
  if (kind < uint8_t(FrameKind::kHello) || kind > uint8_t(FrameKind::kAck)) {
    return std::unexpected(
        make_error(WireErrc::kBadKind, "unknown frame kind " + std::to_string(kind)));
  }
  if (auto flags = std::to_integer<uint8_t>(p[5]); flags != 0) {
    return std::unexpected(
        make_error(WireErrc::kBadFlags, "reserved frame flags set: " + hex(p + 5, 1)));
  }
  kind_ = FrameKind{kind};
  part_count_ = load_le<uint16_t>(p + 6);
  header_len_ = load_le<uint32_t>(p + 8);
  if (part_count_ > limits_.max_parts) {
    return std::unexpected(make_error(WireErrc::kTooManyParts,
                                      "frame has " + std::to_string(part_count_) +
                                          " parts, the limit is " +
                                          std::to_string(limits_.max_parts)));
  }
  if (kind_ != FrameKind::kData && part_count_ != 0) {
    return std::unexpected(make_error(WireErrc::kControlFrameParts,
                                      std::string("a ") + kind_name(kind_) + " frame carries " +
                                          std::to_string(part_count_) +
                                          " parts (control frames carry none)"));
  }
  uint32_t max_header =
      kind_ == FrameKind::kData ? limits_.max_header_bytes : kMaxControlHeaderBytes;
  if (header_len_ > max_header) {
    return std::unexpected(make_error(
        WireErrc::kHeaderTooLarge, std::string(kind_name(kind_)) + " header of " +
                                       std::to_string(header_len_) +
                                       " bytes exceeds the limit of " +
                                       std::to_string(max_header) + " bytes"));
  }
  if (table_end(part_count_) + header_len_ > limits_.max_frame_bytes) {
    return std::unexpected(make_error(
        WireErrc::kFrameTooLarge, "frame head of " + std::to_string(header_len_) +
                                      " header bytes exceeds the frame limit of " +
                                      std::to_string(limits_.max_frame_bytes) + " bytes"));
  }
  return ok();
}

Status FrameDecoder::parse_table() {
  const std::byte* p = buf_.data() + begin_;
  size_t total = table_end(part_count_) + header_len_;
  part_lens_.resize(part_count_);
  for (uint32_t i = 0; i < part_count_; ++i) {
    part_lens_[i] = load_le<uint64_t>(p + table_end(i));
    if (__builtin_add_overflow(total, part_lens_[i], &total)) {
      return std::unexpected(make_error(
          WireErrc::kFrameTooLarge, "frame part lengths overflow at part " + std::to_string(i)));
    }
  }
  if (total > limits_.max_frame_bytes) {
    return std::unexpected(make_error(WireErrc::kFrameTooLarge,
                                      "frame of " + std::to_string(total) +
                                          " bytes exceeds the limit of " +
                                          std::to_string(limits_.max_frame_bytes) + " bytes"));
  }
  head_len_ = table_end(part_count_) + header_len_;
  return ok();
}

bool FrameDecoder::grow_big(size_t need) {
  size_t len = part_lens_[parts_.size()];
  size_t cap = std::min<size_t>(len, std::max(need, part_cap_ * 2));
  if (cap <= part_cap_) return cap >= need;
  void* p = std::realloc(big_.get(), cap);
  if (!p) return false;
  (void)big_.release();  // realloc freed or kept it
  big_.reset(static_cast<std::byte*>(p));
  part_cap_ = cap;
  return true;
}

Result<bool> FrameDecoder::read_parts() {
  while (parts_.size() < part_count_) {
    size_t len = part_lens_[parts_.size()];
    size_t avail = end_ - begin_;
    if (!part_data()) {
      if (len == 0) {
        parts_.emplace_back();
        continue;
      }
      part_filled_ = 0;
      part_cap_ = 0;
      if (len <= kEagerPartBytes) {
        part_ = std::make_shared_for_overwrite<std::byte[]>(len);
        part_cap_ = len;
      }
    }
    size_t n = std::min(avail, len - part_filled_);
    // A big part starts at kBigPartFirstBytes (or what already arrived) and doubles (WI-6).
    size_t need = std::max(part_filled_ + n, part_cap_ ? size_t{0} : kBigPartFirstBytes);
    if (!part_ && need > part_cap_ && !grow_big(need)) {
      return std::unexpected(make_error(
          WireErrc::kFrameTooLarge, "no memory for part " + std::to_string(parts_.size()) +
                                        " of " + std::to_string(len) + " bytes"));
    }
    std::memcpy(part_data() + part_filled_, buf_.data() + begin_, n);
    begin_ += n;
    part_filled_ += n;
    if (part_filled_ < len) return false;
    if (part_) {
      parts_.push_back(own(std::move(part_), len));
    } else {
      std::byte* p = big_.release();
      parts_.push_back(Buffer::received(std::shared_ptr<const void>(p, [](const void* q) {
                                          std::free(const_cast<void*>(q));
                                        }),
                                        p, len));
    }
    part_cap_ = 0;
  }
  return true;
}

Result<bool> FrameDecoder::next(RawFrame& out) {
  switch (state_) {
    case State::kPrefix:
      if (end_ - begin_ < kPrefixBytes) return false;
      if (auto s = parse_prefix(); !s) return std::unexpected(std::move(s.error()));
      state_ = State::kTable;
      [[fallthrough]];
    case State::kTable:
      if (end_ - begin_ < table_end(part_count_)) return false;
      if (auto s = parse_table(); !s) return std::unexpected(std::move(s.error()));
      state_ = State::kHeader;
      [[fallthrough]];
    case State::kHeader:
      if (end_ - begin_ < head_len_) return false;
      frame_ = begin_;
      begin_ += head_len_;
      header_saved_ = false;
      parts_.reserve(part_count_);
      state_ = State::kParts;
      [[fallthrough]];
    case State::kParts: {
      auto done = read_parts();
      if (!done) return std::unexpected(std::move(done.error()));
      if (!*done) return false;
      out.kind = kind_;
      out.header = header();
      out.parts = std::move(parts_);
      parts_ = {};
      state_ = State::kPrefix;
      return true;
    }
  }
  return false;
}

}  // namespace podium::wire
