// podium::Error — the one error value of the C++ core.
//
// Fallible functions return `Result<T>` (std::expected<T, Error>) and are [[nodiscard]]; the
// core throws no exceptions. An Error is small and serialisable: it crosses machines inside
// undeliverable and failure messages, so it holds only a subsystem, a code from that
// subsystem's enum, and a human-readable message that names who failed and why.
//
// Exceptions appear only at the Python edge, where one translation table maps
// (subsystem, code) to an exception type.
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <string_view>

namespace podium {

enum class Subsystem : uint8_t {
  kBase = 0,
  kNdslice = 1,
  kWire = 2,
  kChannel = 3,
  kActor = 4,
  kMesh = 5,
  kHost = 6,
  kSupervision = 7,
  kData = 8,
};

std::string_view subsystem_name(Subsystem s);

// Codes shared by every subsystem; subsystem enums start at 100.
enum class BaseErrc : uint16_t {
  kOk = 0,
  kInvalidArgument = 1,
  kIo = 2,
  kTimeout = 3,
  kCancelled = 4,
  kInternal = 5,
  kUnsupported = 6,
};
constexpr Subsystem subsystem_of(BaseErrc) { return Subsystem::kBase; }

struct Error {
  Subsystem subsystem = Subsystem::kBase;
  uint16_t code = 0;
  std::string message;

  // "channel/104: connection refused by unix:/run/..."
  std::string to_string() const;

  template <class E>
  bool is(E e) const {
    return subsystem == subsystem_of(e) && code == static_cast<uint16_t>(e);
  }
};

template <class E>
[[nodiscard]] Error make_error(E code, std::string message) {
  return Error{subsystem_of(code), static_cast<uint16_t>(code), std::move(message)};
}

// strerror(err); for EMFILE also the limit this process reached, RLIMIT_NOFILE soft and hard,
// and what raises it (HO-7).
[[nodiscard]] std::string errno_text(int err);

// An Error for a failed system call: "<what>: <errno_text(err)>".
[[nodiscard]] Error errno_error(std::string_view what, int err);

template <class T>
using Result = std::expected<T, Error>;

// Result<void> helpers.
using Status = std::expected<void, Error>;
inline Status ok() { return {}; }

}  // namespace podium
