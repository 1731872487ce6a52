// HttpResponder (http.h, HT-1..HT-3).
#include "podium/channel/http.h"

#include <asio/bind_executor.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/write.hpp>

#include <array>
#include <mutex>
#include <set>
#include <string_view>
#include <utility>

#include "podium/channel/net.h"

namespace podium::channel {

namespace {

using Tcp = asio::ip::tcp;
using Strand = asio::strand<asio::io_context::executor_type>;

std::string_view reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Status";
  }
}

Error listen_error(const Address& addr, const std::string& why) {
  return make_error(ChannelErrc::kListenFailed, "http listen on " + addr.to_string() + ": " + why);
}

}  // namespace

class HttpConnection;

struct HttpResponder::Impl : std::enable_shared_from_this<Impl> {
  Impl(asio::io_context& io, Handler h, HttpLimits l)
      : io(io), strand(asio::make_strand(io)), acceptor(strand), handler(std::move(h)),
        limits(l) {}

  asio::io_context& io;
  Strand strand;  // the acceptor's
  Tcp::acceptor acceptor;
  Handler handler;
  HttpLimits limits;
  Address bound;
  mutable std::mutex mu;  // guards stopped, connections
  bool stopped = false;
  std::set<std::shared_ptr<HttpConnection>> connections;

  void accept();
  void forget(const std::shared_ptr<HttpConnection>& c) {
    std::lock_guard lock(mu);
    connections.erase(c);
  }
};

// One request: reads its head (HT-2), hands the path on, writes the answer, closes. Every
// member is touched on `strand` only.
class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  // `socket` was accepted on a strand of its own (its executor).
  HttpConnection(std::weak_ptr<HttpResponder::Impl> owner, Tcp::socket socket,
                 const HttpLimits& limits)
      : owner_(std::move(owner)), strand_(socket.get_executor()), socket_(std::move(socket)),
        timer_(strand_), limits_(limits) {}

  void start() {
    arm(limits_.head_deadline, 0);
    read();
  }

  // From any thread: the answer, once (HT-3).
  void respond(int status, std::string content_type, std::string body) {
    asio::post(strand_, [self = shared_from_this(), status, ct = std::move(content_type),
                         b = std::move(body)]() mutable { self->write(status, ct, std::move(b)); });
  }

  void close_from_any_thread() {
    asio::post(strand_, [self = shared_from_this()] { self->close(); });
  }

 private:
  void arm(std::chrono::milliseconds after, int status) {
    timer_.expires_after(after);
    timer_.async_wait(asio::bind_executor(
        strand_, [self = shared_from_this(), status](const std::error_code& ec) {
          if (ec) return;
          if (status != 0) {
            self->write(status, "text/plain", "podium: no answer in time\n");
          } else {
            self->close();  // HT-2: no complete head in time
          }
        }));
  }

  void read() {
    socket_.async_read_some(
        asio::buffer(buf_),
        asio::bind_executor(strand_, [self = shared_from_this()](const std::error_code& ec,
                                                                 size_t n) {
          if (ec || self->done_) {
            self->close();
            return;
          }
          self->head_.append(self->buf_.data(), n);
          size_t end = self->head_.find("\r\n\r\n");
          if (end == std::string::npos) end = self->head_.find("\n\n");
          if (end == std::string::npos) {
            if (self->head_.size() > self->limits_.max_head_bytes) {
              self->write(431, "text/plain", "podium: request head too large\n");
            } else {
              self->read();
            }
            return;
          }
          if (end > self->limits_.max_head_bytes) {
            self->write(431, "text/plain", "podium: request head too large\n");
            return;
          }
          self->on_head(std::string_view(self->head_).substr(0, end));
        }));
  }

  void on_head(std::string_view head) {
    std::string_view line = head.substr(0, head.find('\n'));
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    size_t sp1 = line.find(' ');
    size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos || sp2 == sp1 + 1 ||
        line.substr(sp2 + 1).rfind("HTTP/", 0) != 0) {
      write(400, "text/plain", "podium: bad request line\n");
      return;
    }
    if (line.substr(0, sp1) != "GET") {
      write(405, "text/plain", "podium: GET only\n");
      return;
    }
    std::string path(line.substr(sp1 + 1, sp2 - sp1 - 1));
    auto owner = owner_.lock();
    if (!owner) {
      close();
      return;
    }
    waiting_ = true;
    arm(limits_.response_deadline, 503);
    std::weak_ptr<HttpConnection> weak = shared_from_this();
    owner->handler(std::move(path), [weak](int status, std::string ct, std::string body) {
      if (auto self = weak.lock()) self->respond(status, std::move(ct), std::move(body));
    });
  }

  void write(int status, const std::string& content_type, std::string body) {
    if (done_) return;
    done_ = true;
    timer_.cancel();
    out_ = "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason(status)) +
           "\r\nContent-Type: " + content_type + "\r\nContent-Length: " +
           std::to_string(body.size()) +
           "\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n" + body;
    asio::async_write(socket_, asio::buffer(out_),
                      asio::bind_executor(strand_, [self = shared_from_this()](
                                                       const std::error_code&, size_t) {
                        std::error_code ignored;
                        self->socket_.shutdown(Tcp::socket::shutdown_both, ignored);
                        self->close();
                      }));
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    done_ = true;
    timer_.cancel();
    std::error_code ignored;
    socket_.close(ignored);
    if (auto owner = owner_.lock()) owner->forget(shared_from_this());
  }

  std::weak_ptr<HttpResponder::Impl> owner_;
  asio::any_io_executor strand_;
  Tcp::socket socket_;
  asio::steady_timer timer_;
  HttpLimits limits_;
  std::array<char, 2048> buf_{};
  std::string head_;
  std::string out_;
  bool waiting_ = false;
  bool done_ = false;  // answered (or closing): nothing more is read or written
  bool closed_ = false;
};

void HttpResponder::Impl::accept() {
  acceptor.async_accept(
      asio::make_strand(io),
      asio::bind_executor(strand, [self = shared_from_this()](const std::error_code& ec,
                                                              Tcp::socket socket) {
        if (ec == asio::error::operation_aborted) return;
        std::shared_ptr<HttpConnection> c;
        {
          std::lock_guard lock(self->mu);
          if (self->stopped) return;
          if (!ec && self->connections.size() < self->limits.max_connections) {
            c = std::make_shared<HttpConnection>(self, std::move(socket), self->limits);
            self->connections.insert(c);
          }
        }
        if (c) {
          c->start();
        } else if (!ec) {  // HT-2: over the cap
          std::error_code ignored;
          socket.close(ignored);
        }
        self->accept();
      }));
}

Result<std::shared_ptr<HttpResponder>> HttpResponder::listen(asio::io_context& io,
                                                             const Address& addr,
                                                             Handler handler,
                                                             HttpLimits limits) {
  if (addr.transport != Transport::kTcp) return std::unexpected(listen_error(addr, "TCP only"));
  std::error_code ec;
  Tcp::resolver resolver(io);
  auto found = resolver.resolve(addr.target, std::to_string(addr.port), ec);
  if (ec || found.empty()) {
    return std::unexpected(listen_error(addr, "resolve: " + (ec ? ec.message() : "no address")));
  }
  for (const auto& e : found) {  // HT-1
    if (!e.endpoint().address().is_loopback()) {
      return std::unexpected(listen_error(
          addr, e.endpoint().address().to_string() + " is not a loopback address: this "
                "responder authenticates nobody, so it serves this host only"));
    }
  }
  auto impl = std::make_shared<Impl>(io, std::move(handler), limits);
  Tcp::endpoint at = found.begin()->endpoint();
  impl->acceptor.open(at.protocol(), ec);
  if (!ec) impl->acceptor.bind(at, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return std::unexpected(listen_error(addr, ec.message()));
  impl->bound = addr;
  impl->bound.port = impl->acceptor.local_endpoint(ec).port();
  asio::post(impl->strand, [impl] { impl->accept(); });
  return std::shared_ptr<HttpResponder>(new HttpResponder(std::move(impl)));
}

HttpResponder::~HttpResponder() { stop(); }

const Address& HttpResponder::bound() const { return impl_->bound; }

void HttpResponder::stop() {
  std::set<std::shared_ptr<HttpConnection>> open;
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->stopped) return;
    impl_->stopped = true;
    open.swap(impl_->connections);
  }
  asio::post(impl_->strand, [impl = impl_] {
    std::error_code ignored;
    impl->acceptor.close(ignored);
  });
  for (const auto& c : open) c->close_from_any_thread();
}

size_t HttpResponder::open_connections() const {
  std::lock_guard lock(impl_->mu);
  return impl_->connections.size();
}

}  // namespace podium::channel
