// The word sum of summed reads (checksum.h, DA-40).
#include "podium/data/checksum.h"

#include <bit>
#include <cstring>

namespace podium::data {
namespace {

inline uint64_t load_le(const unsigned char* p) {
  uint64_t w;
  std::memcpy(&w, p, sizeof w);  // any alignment; one 8-byte load where the target allows
  if constexpr (std::endian::native == std::endian::big) w = __builtin_bswap64(w);
  return w;
}

}  // namespace

uint64_t word_sum(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;  // independent chains: the adds overlap
  size_t i = 0;
  for (; i + 32 <= size; i += 32) {
    a0 += load_le(p + i);
    a1 += load_le(p + i + 8);
    a2 += load_le(p + i + 16);
    a3 += load_le(p + i + 24);
  }
  for (; i + 8 <= size; i += 8) a0 += load_le(p + i);
  if (i < size) {  // the last partial word, zero-padded
    unsigned char tail[8] = {};
    std::memcpy(tail, p + i, size - i);
    a0 += load_le(tail);
  }
  return a0 + a1 + a2 + a3;
}

std::string encode_sums(const std::vector<uint64_t>& sums) {
  std::string out(8 * sums.size(), '\0');
  for (size_t k = 0; k < sums.size(); ++k) {
    for (size_t b = 0; b < 8; ++b) {
      out[8 * k + b] = static_cast<char>((sums[k] >> (8 * b)) & 0xff);
    }
  }
  return out;
}

}  // namespace podium::data
