// podium::ndslice error codes. Every fallible ndslice function returns one of these inside a
// podium::Error whose message names the operation, the label and the valid range.
#pragma once

#include <cstdint>

#include "podium/base/error.h"

namespace podium::ndslice {

enum class NdsliceErrc : uint16_t {
  kDuplicateLabel = 100,  // a label appears twice, or a new label is already in use
  kUnknownLabel = 101,    // no dimension has this label (Python: TypeError)
  kOutOfRange = 102,      // index, rank, coordinate or base rank outside (Python: IndexError)
  kBadStep = 103,         // a range step that is zero or negative
  kBadShape = 104,        // empty label, size 0, lengths that differ, sizes that do not multiply
  kBadLayout = 105,       // slice strides that overlap or overflow (SL-3)
  kNotFlattenable = 106,  // ranks not evenly spaced, so no single dimension describes them
  kMalformed = 107,       // bytes or msgpack object that do not decode to a valid value
};
constexpr Subsystem subsystem_of(NdsliceErrc) { return Subsystem::kNdslice; }

}  // namespace podium::ndslice
