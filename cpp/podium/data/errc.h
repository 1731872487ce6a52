// podium::data::DataErrc — the data plane's error codes (Subsystem::kData).
//
// Threads: constants only.
#pragma once

#include <cstdint>

#include "podium/base/error.h"

namespace podium::data {

enum class DataErrc : uint16_t {
  // UCX could not start (no context, no worker) or a UCX call failed: the message names the
  // call and UCX's status text.
  kUnavailable = 100,
  // An argument that cannot work: a size that does not fit, a bad worker address or rkey.
  kInvalidArgument = 101,
  // The transfer did not finish within its timeout; what was in flight was cancelled.
  kTimeout = 102,
  // The buffer was dropped (or its owner stopped): its memory is no longer registered.
  kDropped = 103,
  // The capability token does not match the buffer's: the owner refused the access.
  kRefused = 104,
  // The transfer failed in UCX (the peer went away, the connection broke).
  kTransferFailed = 105,
  // The engine was stopped; nothing new is accepted.
  kStopped = 106,
};
constexpr Subsystem subsystem_of(DataErrc) { return Subsystem::kData; }

}  // namespace podium::data
