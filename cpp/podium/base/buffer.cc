#include "podium/base/buffer.h"

namespace podium {

Buffer Buffer::from_string(std::string s) {
  auto owner = std::make_shared<std::string>(std::move(s));
  const auto* data = reinterpret_cast<const std::byte*>(owner->data());
  size_t size = owner->size();
  return Buffer(std::move(owner), data, size);
}

Buffer Buffer::from_vector(std::vector<std::byte> v) {
  auto owner = std::make_shared<std::vector<std::byte>>(std::move(v));
  const auto* data = owner->data();
  size_t size = owner->size();
  return Buffer(std::move(owner), data, size);
}

Buffer Buffer::copy_of(std::span<const std::byte> bytes) {
  // One allocation for the bytes and the reference count (small headers are copied often).
  auto owner = std::make_shared_for_overwrite<std::byte[]>(bytes.size());
  if (!bytes.empty()) std::memcpy(owner.get(), bytes.data(), bytes.size());
  const std::byte* data = owner.get();
  return Buffer(std::shared_ptr<const void>(owner, data), data, bytes.size());
}

}  // namespace podium
