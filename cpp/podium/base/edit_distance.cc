#include "podium/base/edit_distance.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace podium::base {
namespace {

// The code points of `s`; a byte that does not start a valid sequence is one of its own.
std::vector<char32_t> code_points(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<uint8_t>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) {
      ok = (static_cast<uint8_t>(s[i + k]) & 0xC0) == 0x80;
    }
    if (!ok) {
      out.push_back(0x110000 + c);  // outside Unicode: never equal to a real code point
      ++i;
      continue;
    }
    char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}

}  // namespace

std::optional<size_t> edit_distance_below(std::string_view a_text, std::string_view b_text,
                                          size_t limit) {
  if (limit == 0) return std::nullopt;
  auto a = code_points(a_text), b = code_points(b_text);
  if (a.size() < b.size()) std::swap(a, b);
  if (a.size() - b.size() >= limit) return std::nullopt;
  if (b.empty()) return a.size();  // < limit, checked above
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    size_t best = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t d = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
      cur[j] = d;
      best = std::min(best, d);
    }
    if (best >= limit) return std::nullopt;  // every path through this row costs limit or more
    std::swap(prev, cur);
  }
  return prev[b.size()] < limit ? std::optional<size_t>(prev[b.size()]) : std::nullopt;
}

}  // namespace podium::base
