// podium::channel::probe — one plain connect to an address, to tell at once that nothing
// listens there (attach_to_workers fails fast on a refused worker, docs/host_agent.md HA-3).
//
// Threads: `done` runs once, on a thread running `io`; the probe owns its socket until then.
#pragma once

#include <functional>
#include <string>
#include <system_error>

#include "podium/channel/address.h"

namespace asio {
class io_context;
}

namespace podium::channel {

// Dials `addr` (TCP or Unix; no handshake) and closes the connection: done({}) when
// something accepted it; otherwise done(ec) with why (connection refused, no such socket
// file, unreachable). A name that does not resolve is reported as host_not_found. A dial
// that neither completes nor fails is given up after `timeout_ms` with timed_out.
void probe(asio::io_context& io, const Address& addr, int timeout_ms,
           std::function<void(std::error_code)> done);

// Whether `ec` from probe() says that nothing will ever answer there (not a slow network).
bool nothing_listens(const std::error_code& ec);

}  // namespace podium::channel
