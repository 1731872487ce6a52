// podium::Buffer — an immutable, reference-counted byte range.
//
// Large message parts travel as Buffers from the sender's memory to writev() without being
// copied into one contiguous frame. The owner keeps the memory alive (a std::string, a
// std::vector, a Python object holding a buffer export); the Buffer never frees `data` itself.
//
// A Buffer over memory that a receiver allocated for itself (a part read from the wire,
// Buffer::received) may be written by whoever holds the only reference to it (sole_writer):
// that is how a received tensor becomes the tensor's own storage without a copy.
//
// BU-1 A Buffer is writable by its holder only when it is received memory that no other
//   Buffer refers to (sole_writer); a sender's memory never is.
//
// Thread-safety: a Buffer may be copied and read from any thread (shared_ptr semantics).
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace podium {

class Buffer {
 public:
  Buffer() = default;
  Buffer(std::shared_ptr<const void> owner, const std::byte* data, size_t size)
      : owner_(std::move(owner)), data_(data), size_(size) {}

  // Takes ownership of the bytes of `s` (moved, not copied).
  static Buffer from_string(std::string s);
  static Buffer from_vector(std::vector<std::byte> v);
  // Copies `bytes` into a new owned allocation.
  static Buffer copy_of(std::span<const std::byte> bytes);
  static Buffer copy_of(std::string_view s) {
    return copy_of(std::as_bytes(std::span<const char>(s.data(), s.size())));
  }

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::span<const std::byte> span() const { return {data_, size_}; }
  std::string_view view() const { return {reinterpret_cast<const char*>(data_), size_}; }

  // Memory the receiver allocated for this part alone (nobody else has its address).
  static Buffer received(std::shared_ptr<const void> owner, const std::byte* data, size_t size) {
    Buffer b(std::move(owner), data, size);
    b.received_ = true;
    return b;
  }

  // sole_writer() (BU-1) is true only when this Buffer is received memory and no other Buffer
  //   (a copy, a slice) refers to it: its holder may hand it out writable. A sender's memory
  //   (a Python object's export, a string) is never writable through a Buffer.
  bool sole_writer() const { return received_ && owner_.use_count() == 1; }

  // A sub-range sharing this buffer's owner.
  Buffer slice(size_t offset, size_t length) const {
    Buffer b(owner_, data_ + offset, length);
    b.received_ = received_;
    return b;
  }

 private:
  std::shared_ptr<const void> owner_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  bool received_ = false;
};

}  // namespace podium
