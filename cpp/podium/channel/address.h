// podium::channel::Address — where a proc listens: "inproc:NAME", "unix:PATH" (or
// "unix:@NAME" for the abstract namespace) or "tcp:HOST:PORT[/INCARNATION]". A ProcId carries
// its Address, so any actor reference routes without a directory.
//
// The incarnation (CH-12) tells apart two listeners that used the same TCP port one after the
// other: the kernel hands a dead proc's port to a new one, and without it the new proc would
// inherit the old one's identity (its death record, its stale messages). It is written as 1 to
// 16 lowercase hex digits with no leading 0 (one spelling per value); 0 in the struct means
// none (an address a person chose, such as a worker's --listen). It names the listener only:
// the socket dials HOST:PORT.
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
  uint64_t incarnation = 0;  // tcp only; 0: none (CH-12)

  [[nodiscard]] static Result<Address> parse(std::string_view text);
  std::string to_string() const;
  auto operator<=>(const Address&) const = default;
};

// A worker's address as people write it (`podium worker --listen`, attach_to_workers), in
// the channel-URL forms Monarch's workers take:
//   tcp://HOST:PORT    (also tcp:HOST:PORT and HOST:PORT)
//   ipc://PATH         a Unix socket at PATH (absolute, or relative); ipc://NAME without a '/'
//                      is the abstract socket unix:@NAME. Protected by the socket file's mode
//                      0600 and SO_PEERCRED (CH-16), and by the job's secret.
//   tcp://HOST:fdN     serve on the listening socket inherited as descriptor N (its port is
//                      the socket's); HOST is the name controllers dial
//   DIAL@BIND          serve on BIND, while controllers dial DIAL (NAT, containers,
//                      port-forwarding): "tcp://worker-fqdn:4444@tcp://0.0.0.0:4444". A DIAL
//                      port of 0 stands for the port BIND got.
// CH-24 parse_worker_address() accepts exactly these forms and refuses anything else naming
//       the text and what is wrong; the address a controller dials (`dial`) is never a
//       descriptor, and one without '@' dials what it binds.
struct WorkerAddress {
  Address dial;     // what controllers dial, and the worker's identity
  Address bind;     // what the worker listens on
  int fd = -1;      // >= 0: adopt this listening socket instead of binding
  bool alias = false;  // written as DIAL@BIND
};
[[nodiscard]] Result<WorkerAddress> parse_worker_address(std::string_view text);
// The URL form of `a` ("tcp://h:p", "ipc:///path", "ipc://name").
std::string worker_url(const Address& a);

// A fresh incarnation for a listener a spawner is about to start on a TCP port it reserved:
// random, 32 bits, never 0 (two incarnations collide only on the same port, 1 in 2^32).
uint64_t new_incarnation();

}  // namespace podium::channel

template <>
struct std::hash<podium::channel::Address> {
  size_t operator()(const podium::channel::Address& a) const noexcept {
    size_t kind = (size_t(a.transport) << 16 | a.port) ^ a.incarnation;
    return std::hash<std::string>()(a.target) ^ kind * 0x9e3779b97f4a7c15ULL;
  }
};
