// HttpResponder (http.h, HT-1..HT-3): a real loopback listener, driven by blocking clients.
#include "podium/channel/http.h"

#include <gtest/gtest.h>

#include <asio/connect.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <array>
#include <chrono>
#include <mutex>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "podium/channel/test_util.h"

namespace podium::channel {
namespace {

using namespace std::chrono_literals;
using Tcp = asio::ip::tcp;
using testing::eventually;

struct Served {
  explicit Served(HttpResponder::Handler handler, HttpLimits limits = {}) {
    auto r = HttpResponder::listen(io, *Address::parse("tcp:127.0.0.1:0"), std::move(handler),
                                   limits);
    EXPECT_TRUE(r) << r.error().to_string();
    http = *r;
    thread = std::thread([this] { io.run(); });
  }
  ~Served() {
    http->stop();
    work.reset();
    io.stop();
    thread.join();
  }
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::shared_ptr<HttpResponder> http;
  std::thread thread;
};

// Sends `request` and returns everything until the server closes.
std::string http_exchange(uint16_t port, const std::string& request) {
  asio::io_context io;
  Tcp::socket s(io);
  s.connect(Tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  asio::write(s, asio::buffer(request));
  std::string out;
  std::error_code ec;
  std::array<char, 4096> buf;
  while (true) {
    size_t n = s.read_some(asio::buffer(buf), ec);
    if (ec) break;
    out.append(buf.data(), n);
  }
  return out;
}

HttpResponder::Handler echo_path() {
  return [](std::string path, HttpResponder::Respond respond) {
    respond(200, "text/plain", "path " + path);
  };
}

TEST(HttpResponder, AnswersAGetWithItsHandlersBodyAndCloses) {  // HT-1, HT-3
  Served s(echo_path());
  std::string got = http_exchange(s.http->bound().port,
                             "GET /api/state?x=1 HTTP/1.1\r\nHost: localhost\r\n\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << got;
  EXPECT_NE(got.find("Content-Length: 19\r\n"), std::string::npos) << got;
  EXPECT_NE(got.find("Connection: close\r\n"), std::string::npos) << got;
  EXPECT_TRUE(got.ends_with("\r\n\r\npath /api/state?x=1")) << got;
  EXPECT_TRUE(eventually([&] { return s.http->open_connections() == 0; }, 10s));
}

TEST(HttpResponder, ListensOnLoopbackOnly) {  // HT-1
  asio::io_context io;
  auto r = HttpResponder::listen(io, *Address::parse("tcp:0.0.0.0:0"), echo_path());
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("not a loopback address"), std::string::npos);
}

TEST(HttpResponder, RefusesOtherMethodsBadLinesAndOversizeHeads) {  // HT-2
  HttpLimits limits;
  limits.max_head_bytes = 256;
  Served s(echo_path(), limits);
  uint16_t port = s.http->bound().port;
  EXPECT_EQ(http_exchange(port, "POST / HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(http_exchange(port, "garbage\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  std::string big = "GET / HTTP/1.1\r\nX: " + std::string(1000, 'a') + "\r\n\r\n";
  EXPECT_EQ(http_exchange(port, big).rfind("HTTP/1.1 431", 0), 0u);
  // The responder goes on serving.
  EXPECT_EQ(http_exchange(port, "GET / HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
}

TEST(HttpResponder, ClosesAnIncompleteHeadAtItsDeadlineAndCapsConnections) {  // HT-2
  HttpLimits limits;
  limits.head_deadline = 200ms;
  limits.max_connections = 2;
  Served s(echo_path(), limits);
  uint16_t port = s.http->bound().port;
  asio::io_context io;
  std::vector<std::unique_ptr<Tcp::socket>> idle;
  for (int i = 0; i < 3; ++i) {
    idle.push_back(std::make_unique<Tcp::socket>(io));
    idle.back()->connect(Tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
    asio::write(*idle.back(), asio::buffer(std::string("GET / HT")));
  }
  // The third was over the cap: closed at once; the two others at the deadline.
  std::array<char, 16> buf;
  std::error_code ec;
  for (auto& sock : idle) {
    sock->read_some(asio::buffer(buf), ec);
    EXPECT_TRUE(ec == asio::error::eof || ec == asio::error::connection_reset) << ec.message();
  }
  EXPECT_TRUE(eventually([&] { return s.http->open_connections() == 0; }, 10s));
  EXPECT_EQ(http_exchange(port, "GET / HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
}

TEST(HttpResponder, AnswersFromAnotherThreadAndStopsCleanly) {  // HT-3
  std::vector<std::thread> answerers;
  std::mutex mu;
  Served s([&](std::string, HttpResponder::Respond respond) {
    std::lock_guard lock(mu);
    answerers.emplace_back([respond] {
      std::this_thread::sleep_for(20ms);
      respond(200, "application/json", "{}");
      respond(500, "text/plain", "twice");  // ignored: one answer per request
    });
  });
  std::string got = http_exchange(s.http->bound().port, "GET /x HTTP/1.1\r\n\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
  EXPECT_TRUE(got.ends_with("{}")) << got;
  s.http->stop();
  s.http->stop();
  for (auto& t : answerers) t.join();
}

}  // namespace
}  // namespace podium::channel
