// podium::channel::HttpResponder — a minimal HTTP/1.x responder for a page a browser reads on
// this host (the dashboard, docs/interactive.md, DS-4). It is not podium's protocol: it
// proves nothing of its peers, so it serves loopback only, and what it serves comes from its
// handler (the dashboard's: a DebugController call over the channel).
//
//   HT-1 It listens on loopback addresses only (listen() refuses any other, and a name that
//        resolves to any other), answers GET only, one request per connection
//        (`Connection: close`).
//   HT-2 Bounded before anything is handed on: a request head (request line and headers)
//        over HttpLimits::max_head_bytes gets 431 and the connection closes; a head not
//        complete within HttpLimits::head_deadline is closed; at most
//        HttpLimits::max_connections are open at once (more are closed at accept); a method
//        other than GET gets 405 and a malformed request line 400. A request body is never
//        read.
//   HT-3 The handler runs on a thread of the io_context and must not block: it gets the
//        path (with its query) and a Respond, which may be called once, from any thread (the
//        write runs on the connection's strand). A request not answered within
//        HttpLimits::response_deadline gets 503. stop() closes the listener and every
//        connection; a Respond called after stop() or after its connection closed does
//        nothing.
//
// Threads: listen(), stop(), bound(), open_connections() from any thread; the io_context may
// be run by several threads (each connection runs on a strand of its own).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "podium/base/error.h"
#include "podium/channel/address.h"

namespace asio {
class io_context;
}

namespace podium::channel {

struct HttpLimits {
  size_t max_head_bytes = 8192;
  std::chrono::milliseconds head_deadline{10'000};
  std::chrono::milliseconds response_deadline{60'000};
  size_t max_connections = 64;
};

class HttpResponder {
 public:
  using Respond = std::function<void(int status, std::string content_type, std::string body)>;
  using Handler = std::function<void(std::string path, Respond respond)>;

  // Listens on `addr` (tcp:HOST:PORT, HOST a loopback address or a name of only such; port 0:
  // any free one). HT-1.
  [[nodiscard]] static Result<std::shared_ptr<HttpResponder>> listen(asio::io_context& io,
                                                                     const Address& addr,
                                                                     Handler handler,
                                                                     HttpLimits limits = {});
  ~HttpResponder();
  HttpResponder(const HttpResponder&) = delete;
  HttpResponder& operator=(const HttpResponder&) = delete;

  // The bound address (the chosen port when 0 was asked).
  const Address& bound() const;
  // Closes the listener and every connection (HT-3). Idempotent.
  void stop();
  // Connections open now (tests).
  size_t open_connections() const;

  struct Impl;

 private:
  explicit HttpResponder(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace podium::channel
