// podium fuzz targets (docs/fuzzing.md): one LLVMFuzzerTestOneInput per decoder of peer
// bytes. With clang they link libFuzzer; with GCC they link driver.cc, a seeded mutating
// driver that starts from the inputs podium_fuzz_seeds() returns (valid encodings).
//
// A target returns 0 for every input; a bug is a sanitizer report, an uncaught exception or
// a failed PODIUM_FUZZ_CHECK, each of which ends the process as a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace podium::fuzz {

using Input = std::vector<uint8_t>;
// Valid inputs for the target to start from (defined by each target).
std::vector<Input> seeds();
// The target's name, for the driver's summary line.
extern const char* const kTargetName;

inline Input bytes_of(std::span<const std::byte> b) {
  auto* p = reinterpret_cast<const uint8_t*>(b.data());
  return Input(p, p + b.size());
}

}  // namespace podium::fuzz

// An invariant of the decoder failed: report and crash (the driver saves the input).
#define PODIUM_FUZZ_CHECK(cond)                                                      \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "fuzz check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)
