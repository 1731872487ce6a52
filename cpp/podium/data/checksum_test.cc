// word_sum tests: the checksum of summed reads (DA-40).
#include "podium/data/checksum.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace podium::data {
namespace {

// The definition, byte by byte: byte j of the region weighs 2^(8 * (j % 8)).
uint64_t reference(const unsigned char* p, size_t n) {
  uint64_t s = 0;
  for (size_t j = 0; j < n; ++j) s += static_cast<uint64_t>(p[j]) << (8 * (j % 8));
  return s;
}

std::vector<unsigned char> random_bytes(size_t n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

TEST(WordSum, EqualsTheByteWiseDefinitionForEverySizeAndAlignment) {  // DA-40
  auto bytes = random_bytes(4096 + 64, 1);
  for (size_t off = 0; off < 8; ++off) {
    for (size_t n : {0, 1, 2, 7, 8, 9, 15, 16, 31, 32, 33, 63, 64, 65, 100, 1000, 4095, 4096}) {
      EXPECT_EQ(word_sum(bytes.data() + off, n), reference(bytes.data() + off, n))
          << "offset " << off << ", " << n << " bytes";
    }
  }
  EXPECT_EQ(word_sum(nullptr, 0), 0u);
}

TEST(WordSum, IsLittleEndianAndZeroPadsTheLastWord) {  // DA-40
  unsigned char one[1] = {0xab};
  EXPECT_EQ(word_sum(one, 1), 0xabu);
  unsigned char nine[9] = {1, 0, 0, 0, 0, 0, 0, 0x80, 5};
  EXPECT_EQ(word_sum(nine, 9), (uint64_t{0x80} << 56) + 1 + 5);
}

TEST(WordSum, WrapsModulo2To64) {  // DA-40
  std::vector<unsigned char> ff(8 * 5, 0xff);  // five words of 2^64 - 1
  EXPECT_EQ(word_sum(ff.data(), ff.size()), uint64_t(0) - 5);
}

TEST(WordSum, AWholeIsTheSumOfItsPartsCutAtWords) {  // DA-40: a header is subtracted
  auto bytes = random_bytes(408392 + 5, 2);
  uint64_t whole = word_sum(bytes.data(), bytes.size());
  for (size_t cut : {8, 24, 4096, 408392}) {
    EXPECT_EQ(whole, word_sum(bytes.data(), cut) +
                       word_sum(bytes.data() + cut, bytes.size() - cut));
  }
}

TEST(WordSum, APartsShareIsWhatItsBytesBringWhereverItIsCut) {  // DA-40
  auto bytes = random_bytes(1000, 3);
  uint64_t whole = word_sum(bytes.data(), bytes.size());
  for (size_t cut : {0, 1, 3, 7, 8, 13, 500, 999, 1000}) {
    for (size_t cut2 = cut; cut2 <= bytes.size(); cut2 += 97) {
      EXPECT_EQ(whole, word_sum_at(bytes.data(), cut, 0) +
                           word_sum_at(bytes.data() + cut, cut2 - cut, cut) +
                           word_sum_at(bytes.data() + cut2, bytes.size() - cut2, cut2))
          << cut << " " << cut2;
    }
  }
  for (size_t at = 0; at < 16; ++at) {  // the byte-wise definition, shifted
    uint64_t want = 0;
    for (size_t j = 0; j < 100; ++j) want += static_cast<uint64_t>(bytes[j]) << (8 * ((at + j) % 8));
    EXPECT_EQ(word_sum_at(bytes.data(), 100, at), want) << at;
  }
}

TEST(WordSum, SumsAreEncodedLittleEndian) {
  auto s = encode_sums({0x0102030405060708ull, 0, ~uint64_t{0}});
  ASSERT_EQ(s.size(), 24u);
  EXPECT_EQ(static_cast<unsigned char>(s[0]), 0x08);
  EXPECT_EQ(static_cast<unsigned char>(s[7]), 0x01);
  EXPECT_EQ(s.substr(8, 8), std::string(8, '\0'));
  EXPECT_EQ(s.substr(16, 8), std::string(8, '\xff'));
  EXPECT_EQ(sum_at(s, 0), 0x0102030405060708ull);  // and read back, each at its index
  EXPECT_EQ(sum_at(s, 1), 0u);
  EXPECT_EQ(sum_at(s, 2), ~uint64_t{0});
}

}  // namespace
}  // namespace podium::data
