// podium::channel::Address — where a proc listens: "inproc:NAME", "unix:PATH" (or
// "unix:@NAME" for the abstract namespace) or "tcp:HOST:PORT". A ProcId carries its Address,
// so any actor reference routes without a directory.
//
// Limits checked by parse(): a Unix path or abstract name fits sun_path (at most 107 bytes),
// a TCP port is decimal 0..65535 and an IPv6 host is written in brackets ("tcp:[::1]:80").
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "podium/base/error.h"

namespace podium::channel {

enum class Transport : uint8_t { kInproc = 0, kUnix = 1, kTcp = 2 };

struct Address {
  Transport transport = Transport::kInproc;
  std::string target;  // inproc: name; unix: path or "@name"; tcp: host (IPv4/IPv6 literal or name)
  uint16_t port = 0;   // tcp only

  [[nodiscard]] static Result<Address> parse(std::string_view text);
  std::string to_string() const;
  auto operator<=>(const Address&) const = default;
};

}  // namespace podium::channel

template <>
struct std::hash<podium::channel::Address> {
  size_t operator()(const podium::channel::Address& a) const noexcept {
    size_t kind = size_t(a.transport) << 16 | a.port;
    return std::hash<std::string>()(a.target) ^ kind * 0x9e3779b97f4a7c15ULL;
  }
};
