#include "podium/base/edit_distance.h"

#include <gtest/gtest.h>

#include <string>

namespace podium::base {
namespace {

// ED-1: the distance when below the limit, nullopt otherwise.
TEST(EditDistanceTest, DistanceBelowTheLimit) {
  EXPECT_EQ(edit_distance_below("kitten", "sitting", 10), 3u);
  EXPECT_EQ(edit_distance_below("kitten", "sitting", 4), 3u);
  EXPECT_EQ(edit_distance_below("kitten", "sitting", 3), std::nullopt);
  EXPECT_EQ(edit_distance_below("same", "same", 1), 0u);
  EXPECT_EQ(edit_distance_below("", "", 1), 0u);
  EXPECT_EQ(edit_distance_below("", "abc", 4), 3u);
  EXPECT_EQ(edit_distance_below("abc", "", 3), std::nullopt);
  EXPECT_EQ(edit_distance_below("abc", "abc", 0), std::nullopt);
  EXPECT_EQ(edit_distance_below("[0] loss", "[12] loss", 5), 2u);
}

// ED-1: code points, not bytes: one accented letter is one substitution; a stray byte is one
// code point of its own.
TEST(EditDistanceTest, CountsCodePoints) {
  EXPECT_EQ(edit_distance_below("caf\xc3\xa9", "cafe", 5), 1u);
  EXPECT_EQ(edit_distance_below("\xe2\x82\xac", "$", 5), 1u);
  EXPECT_EQ(edit_distance_below("a\xff", "a", 5), 1u);
  EXPECT_EQ(edit_distance_below("a\xffz", "a\xfez", 5), 1u);
}

// ED-1: the early stop gives the same answers as the full program on longer texts.
TEST(EditDistanceTest, LongTextsStopEarlyWithTheSameAnswer) {
  std::string a(400, 'x'), b(400, 'x');
  b[10] = 'y';
  b[200] = 'z';
  EXPECT_EQ(edit_distance_below(a, b, 60), 2u);
  EXPECT_EQ(edit_distance_below(a, b, 2), std::nullopt);
  std::string c(400, 'q');
  EXPECT_EQ(edit_distance_below(a, c, 60), std::nullopt);
  EXPECT_EQ(edit_distance_below(a, c, 401), 400u);
}

}  // namespace
}  // namespace podium::base
