// podium::mesh::PortRuns and SeqRuns — the compact per-rank tables of a "cast" message
// (docs/cast.md, "Compact rank tables"). A chunk of a cast names, for every rank of [lo, hi),
// the actor's mailbox PortId and its AC-11 number. Listed one by one, that is O(ranks) bytes
// and CPU at every relay; these tables store runs instead, so a relay's work is O(runs):
//
//   PortRuns  consecutive PortIds that differ only in numbers that step by a constant
//             ("unix:/d/m3-17.sock,m3-17#echo[17]:0", "...m3-18...[18]:0", ...) form one run:
//             the literal text between the numbers, and per number its first value and step.
//             The procs of one mesh are named by rank, so a mesh (or a strided slice of it)
//             is one run whatever its size.
//   SeqRuns   consecutive equal AC-11 numbers form one run (count, value). Full-mesh casts
//             after full-mesh casts give every rank the same number: one run; a few direct
//             sends in between add a few runs.
//
// Threads: plain values; a const table may be read from any thread.
// Invariants:
//   CP-1 Exact: at(i) returns the i-th string/number the table was built from, byte for byte,
//        for any input (text that does not fit a run just starts a new one; a number token
//        is a maximal digit run without a leading zero and of at most 18 digits, anything
//        else is literal text).
//   CP-2 slice(lo, hi) and a decoded encode() equal the table restricted to [lo, hi); both
//        cost O(runs), never O(ranks).
//   CP-3 decode() rejects a table whose run counts do not add up to the expected size, or
//        whose runs are malformed, with an error (never a crash).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "podium/base/error.h"

namespace podium::mesh {

class PortRuns {
 public:
  struct Run {
    uint64_t count = 0;
    std::vector<std::string> texts;  // numbers.size() + 1 literal pieces, around the numbers
    std::vector<int64_t> starts;     // each number's value at the run's first rank
    std::vector<int64_t> steps;      // and its change per rank
  };

  PortRuns() = default;
  static PortRuns build(std::span<const std::string* const> ports);
  static PortRuns build(std::span<const std::string> ports);

  size_t size() const { return size_; }
  size_t runs() const { return runs_.size(); }
  std::string at(size_t i) const;                // CP-1; O(log runs)
  PortRuns slice(size_t lo, size_t hi) const;    // CP-2

  // One msgpack value: [[count, [text...], [start, step, start, step, ...]], ...], appended
  // to `out`. decode() reads one such value at `*offset` of `data` and advances it.
  void encode(std::string& out) const;
  [[nodiscard]] static Result<PortRuns> decode(std::string_view data, size_t* offset,
                                               size_t expect);

 private:
  void push(Run r);
  std::vector<Run> runs_;
  std::vector<uint64_t> ends_;  // exclusive end index of each run (prefix sums)
  size_t size_ = 0;
};

class SeqRuns {
 public:
  SeqRuns() = default;
  static SeqRuns build(std::span<const uint64_t> seqs);

  size_t size() const { return size_; }
  size_t runs() const { return values_.size(); }
  uint64_t at(size_t i) const;                  // CP-1; O(log runs)
  SeqRuns slice(size_t lo, size_t hi) const;    // CP-2

  // One msgpack value: [count, value, count, value, ...]; as PortRuns.
  void encode(std::string& out) const;
  [[nodiscard]] static Result<SeqRuns> decode(std::string_view data, size_t* offset,
                                              size_t expect);

 private:
  void push(uint64_t count, uint64_t value);
  std::vector<uint64_t> values_;
  std::vector<uint64_t> ends_;
  size_t size_ = 0;
};

}  // namespace podium::mesh
