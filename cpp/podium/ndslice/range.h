// podium::ndslice::Range — a Python slice `start:stop:step` over one dimension, as in
// mesh.slice(gpus=slice(0, 4)) and Selection::range.
//
// resolve() follows Python's slice.indices(size) for step > 0: a missing start is 0, a
// missing stop is `size`; a negative start or stop counts from the end (adds `size`); both
// are then clamped to [0, size]. The result may be empty (start >= stop). Negative steps
// are not supported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "podium/base/error.h"

namespace podium::ndslice {

struct Range {
  std::optional<int64_t> start;
  std::optional<int64_t> stop;
  int64_t step = 1;

  // The indices start, start + step, ... (count of them) that the range picks in a
  // dimension of `size`. kBadStep when step <= 0.
  struct Indices {
    size_t start = 0;
    size_t count = 0;
    size_t step = 1;
    bool operator==(const Indices&) const = default;
  };
  [[nodiscard]] Result<Indices> resolve(size_t size) const;

  // Python's notation: "1:", ":-1", "0:8:2", ":".
  std::string to_string() const;

  bool operator==(const Range&) const = default;
};

}  // namespace podium::ndslice
