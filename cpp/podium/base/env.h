// podium::env_number — a non-negative whole number from the environment.
//
// Many settings (PODIUM_CMA_PART_MIN, PODIUM_WARM_RECV_BYTES, ...) are read the same way: unset,
// empty or not a decimal number means the default. Thread-safe as std::getenv is.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <optional>

namespace podium {

// The decimal value of environment variable `name`; nullopt when it is unset, empty or holds
// anything but digits.
inline std::optional<uint64_t> env_number(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  unsigned long long n = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0') return std::nullopt;
  return uint64_t(n);
}

}  // namespace podium
