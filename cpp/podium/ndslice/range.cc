#include "podium/ndslice/range.h"

#include <algorithm>

#include "podium/ndslice/errc.h"
#include "podium/ndslice/internal.h"

namespace podium::ndslice {

namespace {

// Python's normalisation of one bound for step > 0: negative counts from the end, then
// clamp to [0, size]. Computed without converting `size` to a signed type.
size_t clamp_bound(int64_t bound, size_t size) {
  if (bound >= 0) return std::min(static_cast<size_t>(bound), size);
  size_t from_end = -static_cast<uint64_t>(bound);
  return from_end >= size ? 0 : size - from_end;
}

}  // namespace

Result<Range::Indices> Range::resolve(size_t size) const {
  if (step <= 0) {
    return std::unexpected(internal::error(
        NdsliceErrc::kBadStep, {"range ", to_string(), ": step must be positive, got ",
                                std::to_string(step)}));
  }
  Indices out;
  out.start = start ? clamp_bound(*start, size) : 0;
  size_t end = stop ? clamp_bound(*stop, size) : size;
  out.step = static_cast<size_t>(step);
  out.count = end > out.start ? (end - out.start - 1) / out.step + 1 : 0;
  return out;
}

std::string Range::to_string() const {
  std::string out;
  if (start) out += std::to_string(*start);
  out += ':';
  if (stop) out += std::to_string(*stop);
  if (step != 1) {
    out += ':';
    out += std::to_string(step);
  }
  return out;
}

}  // namespace podium::ndslice
