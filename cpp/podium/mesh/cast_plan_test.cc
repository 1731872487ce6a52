// The compact rank tables of a "cast" message (cast_plan.h): CP-1 exactness, CP-2 slicing and
// round trips in O(runs), CP-3 rejection of malformed tables.
#include "podium/mesh/cast_plan.h"

#include "podium/mesh/cast.h"

#include <gtest/gtest.h>

#include <msgpack.hpp>
#include <random>
#include <string>
#include <vector>

namespace podium::mesh {
namespace {

std::string port(size_t mesh, size_t rank) {
  return "unix:/tmp/podium-4242/m" + std::to_string(mesh) + "-" + std::to_string(rank) +
         ".sock,m" + std::to_string(mesh) + "-" + std::to_string(rank) + "#echo[" +
         std::to_string(rank) + "]:0";
}

PortRuns round_trip(const PortRuns& t) {
  std::string bytes;
  t.encode(bytes);
  size_t off = 0;
  auto back = PortRuns::decode(bytes, &off, t.size());
  EXPECT_TRUE(back.has_value()) << (back ? "" : back.error().to_string());
  EXPECT_EQ(off, bytes.size());
  return back ? *back : PortRuns{};
}

SeqRuns round_trip(const SeqRuns& t) {
  std::string bytes;
  t.encode(bytes);
  size_t off = 0;
  auto back = SeqRuns::decode(bytes, &off, t.size());
  EXPECT_TRUE(back.has_value()) << (back ? "" : back.error().to_string());
  return back ? *back : SeqRuns{};
}

// CP-1, CP-2: a whole mesh is one run whatever its size, and a message of a few dozen bytes.
TEST(CastPlan, MeshPortsAreOneRunCP1) {
  std::vector<std::string> ports;
  for (size_t r = 0; r < 100000; ++r) ports.push_back(port(7, r));
  auto t = PortRuns::build(ports);
  EXPECT_EQ(t.size(), ports.size());
  EXPECT_EQ(t.runs(), 1u);
  std::string bytes;
  t.encode(bytes);
  EXPECT_LT(bytes.size(), 120u);
  auto back = round_trip(t);
  for (size_t r : {0ul, 1ul, 9ul, 10ul, 99ul, 100ul, 12345ul, 99999ul}) {
    EXPECT_EQ(back.at(r), ports[r]) << r;
  }
  auto s = back.slice(9990, 10010);
  ASSERT_EQ(s.size(), 20u);
  EXPECT_EQ(s.runs(), 1u);
  for (size_t i = 0; i < 20; ++i) EXPECT_EQ(s.at(i), ports[9990 + i]);
}

// A strided, two-dimensional slice (every third rank of rows 1 and 3 of a 4 x 30 mesh) is one
// run per row: the ranks step by 3 within a row and jump between rows.
TEST(CastPlan, StridedSliceCP2) {
  std::vector<std::string> ports;
  for (size_t row : {1ul, 3ul}) {
    for (size_t col = 2; col < 30; col += 3) ports.push_back(port(3, row * 30 + col));
  }
  auto t = PortRuns::build(ports);
  EXPECT_EQ(t.runs(), 2u);
  auto back = round_trip(t);
  for (size_t i = 0; i < ports.size(); ++i) EXPECT_EQ(back.at(i), ports[i]);
  for (size_t lo = 0; lo < ports.size(); ++lo) {
    for (size_t hi = lo + 1; hi <= ports.size(); ++hi) {
      auto s = round_trip(back.slice(lo, hi));
      ASSERT_EQ(s.size(), hi - lo);
      for (size_t i = lo; i < hi; ++i) ASSERT_EQ(s.at(i - lo), ports[i]) << lo << " " << hi;
    }
  }
}

// CP-1 for any text: leading zeros, long digit runs, numbers that step down, no numbers at
// all, empty strings, digits at both ends.
TEST(CastPlan, AnyTextRoundTripsCP1) {
  std::vector<std::string> ports = {"",        "abc",      "abc",     "0",       "00",
                                    "007x",    "x007",     "a9b",     "a8b",     "a7b",
                                    "12345678901234567890123", "9223372036854775807",
                                    "1",       "2",        "3",       "10",      "5-5",
                                    "6-4",     "7-3",      "host01:9", "host02:9"};
  std::mt19937 rng(42);
  const std::string alphabet = "0123456789ab[]#:-/";
  for (int i = 0; i < 400; ++i) {
    std::string s;
    size_t len = rng() % 12;
    for (size_t j = 0; j < len; ++j) s += alphabet[rng() % alphabet.size()];
    ports.push_back(s);
  }
  auto t = PortRuns::build(ports);
  auto back = round_trip(t);
  ASSERT_EQ(back.size(), ports.size());
  for (size_t i = 0; i < ports.size(); ++i) EXPECT_EQ(back.at(i), ports[i]) << i;
  auto s = back.slice(5, 17);
  for (size_t i = 5; i < 17; ++i) EXPECT_EQ(s.at(i - 5), ports[i]);
}

// AC-11 numbers: one run after full-mesh casts; a few direct sends add a few runs.
TEST(CastPlan, SeqRunsCP2) {
  std::vector<uint64_t> seqs(256, 41);
  auto one = SeqRuns::build(seqs);
  EXPECT_EQ(one.runs(), 1u);
  seqs[5] = 42;
  seqs[6] = 42;
  seqs[200] = 50;
  auto t = round_trip(SeqRuns::build(seqs));
  EXPECT_EQ(t.runs(), 5u);
  for (size_t i = 0; i < seqs.size(); ++i) ASSERT_EQ(t.at(i), seqs[i]);
  for (size_t lo = 0; lo < seqs.size(); lo += 7) {
    for (size_t hi = lo + 1; hi <= seqs.size(); hi += 13) {
      auto s = round_trip(t.slice(lo, hi));
      ASSERT_EQ(s.size(), hi - lo);
      for (size_t i = lo; i < hi; ++i) ASSERT_EQ(s.at(i - lo), seqs[i]);
    }
  }
}

// CP-3: counts that do not add up, and garbage, are errors.
TEST(CastPlan, MalformedTablesAreErrorsCP3) {
  std::vector<std::string> ports = {port(1, 0), port(1, 1), port(1, 2)};
  std::string bytes;
  PortRuns::build(ports).encode(bytes);
  size_t off = 0;
  EXPECT_FALSE(PortRuns::decode(bytes, &off, 4).has_value());
  off = 0;
  EXPECT_FALSE(PortRuns::decode(bytes, &off, 2).has_value());
  off = 0;
  EXPECT_FALSE(PortRuns::decode("\xc1garbage", &off, 3).has_value());
  off = 0;
  EXPECT_FALSE(PortRuns::decode(std::string_view(bytes).substr(0, bytes.size() / 2), &off, 3)
                   .has_value());
  std::string seq_bytes;
  SeqRuns::build(std::vector<uint64_t>{1, 1, 2}).encode(seq_bytes);
  off = 0;
  EXPECT_FALSE(SeqRuns::decode(seq_bytes, &off, 5).has_value());
  // A run with a zero count, and an odd-length table.
  msgpack::sbuffer sb;
  msgpack::packer<msgpack::sbuffer> pk(sb);
  pk.pack_array(2);
  pk.pack(0);
  pk.pack(7);
  off = 0;
  EXPECT_FALSE(SeqRuns::decode(std::string_view(sb.data(), sb.size()), &off, 0).has_value());
  msgpack::sbuffer odd;
  msgpack::packer<msgpack::sbuffer> pk2(odd);
  pk2.pack_array(1);
  pk2.pack(3);
  off = 0;
  EXPECT_FALSE(SeqRuns::decode(std::string_view(odd.data(), odd.size()), &off, 3).has_value());
}

// The tree's root hands the collector ranges of equal replies (relay.h, RangeSink): ranks
// answered before keep their first answer (CT-4 duplicates), and the call completes once, when
// the last rank is filled (ME-1).
TEST(CastCollector, FillRangeKeepsFirstAnswersAndCompletesOnce) {
  Collector c(std::vector<std::string>(6, "proc"));
  auto one = Reply(std::vector<Buffer>{Buffer::copy_of(std::as_bytes(std::span("a", 1)))});
  auto err = Reply(std::unexpected(Error{Subsystem::kBase, 1, "gone"}));
  c.fill_range(0, 3, one);
  c.fill(3, err);
  EXPECT_FALSE(c.future().ready());
  c.fill_range(2, 5, err);  // 2 and 3 keep their answers; 4 is new
  EXPECT_FALSE(c.future().ready());
  c.fill_range(5, 9, one);  // clipped to the collector's 6 ranks
  ASSERT_TRUE(c.future().ready());
  auto got = c.future().get();
  ASSERT_TRUE(got);
  ASSERT_EQ(got->size(), 6u);
  EXPECT_TRUE((*got)[0] && (*got)[1] && (*got)[2] && (*got)[5]);
  EXPECT_FALSE((*got)[3]);
  EXPECT_FALSE((*got)[4]);
  c.fill_range(0, 6, err);  // after completion: ignored
}

}  // namespace
}  // namespace podium::mesh
