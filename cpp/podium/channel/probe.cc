#include "podium/channel/probe.h"

#include <cerrno>

#include <asio/error.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <memory>

#include "podium/channel/socket_util.h"

namespace podium::channel {

void probe(asio::io_context& io, const Address& addr, int timeout_ms,
           std::function<void(std::error_code)> done) {
  internal::Endpoint ep;
  if (addr.transport == Transport::kUnix) {
    ep = internal::unix_endpoint(addr.target);
  } else if (addr.transport == Transport::kTcp) {
    auto eps = internal::resolve_tcp(addr.target, addr.port);
    if (!eps || eps->empty()) {
      done(std::make_error_code(std::errc::host_unreachable));
      return;
    }
    ep = eps->front();
  } else {
    done({});
    return;
  }
  struct Probe {
    explicit Probe(asio::io_context& io) : sock(io), timer(io) {}
    internal::Socket sock;
    asio::steady_timer timer;
    std::function<void(std::error_code)> done;
    bool finished = false;
    void finish(std::error_code ec) {
      if (finished) return;
      finished = true;
      std::error_code ignored;
      timer.cancel();
      sock.close(ignored);
      done(ec);
    }
  };
  auto p = std::make_shared<Probe>(io);
  p->done = std::move(done);
  p->timer.expires_after(std::chrono::milliseconds(timeout_ms));
  p->timer.async_wait([p](std::error_code ec) {
    if (!ec) p->finish(std::make_error_code(std::errc::timed_out));
  });
  p->sock.async_connect(ep, [p](std::error_code ec) { p->finish(ec); });
}

bool nothing_listens(const std::error_code& ec) {
  // Asio reports the connect's errno in its own system category: compare the values.
  if (!ec || ec == std::errc::timed_out) return false;
  int v = ec.value();
  return v == ECONNREFUSED || v == ENOENT || v == EHOSTUNREACH || v == ENETUNREACH;
}

}  // namespace podium::channel
