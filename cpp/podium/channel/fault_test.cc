// Faults from outside the Net: garbage on a listening socket, connections cut by shutdown()
// at arbitrary bytes, and a stream between two processes.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <list>

#include "podium/channel/net.h"
#include "podium/channel/test_util.h"
#include "podium/wire/message.h"

namespace podium::channel {
namespace {

using namespace testing;

std::vector<std::byte> hello_bytes(uint32_t version = wire::kSessionProtocolVersion) {
  std::vector<std::byte> b;
  wire::encode(wire::Hello{version, 42, "garbage-test"}, b);
  return b;
}

std::vector<std::byte> data_bytes(size_t parts = 1) {
  wire::Envelope e = numbered(0);
  e.parts.resize(parts);
  std::vector<std::byte> b;
  wire::encode_data(1, e, b);
  for (const Buffer& p : e.parts) b.insert(b.end(), p.span().begin(), p.span().end());
  return b;
}

struct Garbage {
  const char* name;
  std::vector<std::byte> bytes;
  std::string logged;  // the reason the Net must log
  bool half_close = false;
};

std::vector<Garbage> garbage_cases() {
  auto cat = [](std::vector<std::byte> a, const std::vector<std::byte>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  std::vector<Garbage> out;
  std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  auto http_bytes = std::as_bytes(std::span(http.data(), http.size()));
  out.push_back({"http", {http_bytes.begin(), http_bytes.end()}, "bad frame magic 47 45 54"});
  auto v9 = data_bytes();
  v9[3] = std::byte{9};
  out.push_back({"version", cat(hello_bytes(), v9), "frame version 9, this build speaks 1"});
  auto huge = data_bytes();
  huge[12 + 5] = std::byte{1};  // part 0 claims 2^40 bytes
  out.push_back({"oversized", cat(hello_bytes(), huge), "exceeds the limit of 1048576 bytes"});
  out.push_back({"parts", cat(hello_bytes(), data_bytes(9)), "frame has 9 parts, the limit is 8"});
  out.push_back({"no-hello", data_bytes(), "Data before Hello"});
  out.push_back({"session-version", hello_bytes(7), "session protocol version 7"});
  std::vector<std::byte> ack;
  wire::encode(wire::Ack{3}, ack);
  out.push_back({"ack", cat(hello_bytes(), ack), "Ack or HelloAck sent to a listener"});
  auto cut = data_bytes();
  cut.resize(cut.size() - 5);
  out.push_back({"truncated", cat(hello_bytes(), cut), "truncated frame", true});
  std::vector<std::byte> bad_header = hello_bytes();
  bad_header[wire::table_end(0)] = std::byte{0xc1};  // never-used msgpack byte
  out.push_back({"header", bad_header, "malformed Hello header"});
  return out;
}

class ChannelFaultGarbage : public ::testing::TestWithParam<bool> {};  // true: TCP

TEST_P(ChannelFaultGarbage, ClosesOnlyTheOffendingConnection) {  // CH-5
  LogCapture log;
  TempDir dir;
  Receiver receiver;
  Returns returns;
  IoThreads io(2);
  Config c = test_config();
  c.max_frame_bytes = 1 << 20;
  c.max_parts = 8;
  Net rx(io.io(), c, receiver.fn(), returns.fn());
  auto to = rx.listen(*Address::parse(GetParam() ? "tcp:127.0.0.1:0" : "unix:" + dir.path("r")));
  ASSERT_TRUE(to) << to.error().to_string();
  Net tx(io.io(), c, receiver.fn(), returns.fn());
  uint64_t sent = 0;
  for (; sent < 1000; ++sent) tx.send(*to, numbered(sent));
  ASSERT_TRUE(receiver.wait_for(sent, 10s));
  for (const Garbage& g : garbage_cases()) {
    SCOPED_TRACE(g.name);
    int fd = dial(*to);
    ASSERT_GE(fd, 0);
    write_all(fd, g.bytes);
    if (g.half_close) ::shutdown(fd, SHUT_WR);
    EXPECT_TRUE(closed_by_peer(fd, 5s));
    ::close(fd);
    EXPECT_TRUE(log.wait_for({"closing connection from", to->to_string(), g.logged}, 5s));
    for (uint64_t end = sent + 100; sent < end; ++sent) tx.send(*to, numbered(sent));
  }
  EXPECT_TRUE(receiver.wait_for(sent, 10s)) << receiver.count() << " of " << sent;
  EXPECT_EQ(receiver.error(), "");
  EXPECT_EQ(returns.size(), 0u);
  // A new link is served too.
  Net tx2(io.io(), c, receiver.fn(), returns.fn());
  tx2.send(*to, numbered(sent));
  EXPECT_TRUE(receiver.wait_for(sent + 1, 10s));
}

INSTANTIATE_TEST_SUITE_P(UnixAndTcp, ChannelFaultGarbage, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Tcp" : "Unix"; });

// Forwards Unix-socket connections from `front` to `back` byte for byte; kill_all() cuts
// every forwarded connection with shutdown(), wherever its bytes are.
class KillingProxy {
 public:
  KillingProxy(const std::string& front, Address back) : back_(std::move(back)) {
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::strcpy(sa.sun_path, front.c_str());
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    EXPECT_EQ(::listen(listen_fd_, 64), 0);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~KillingProxy() {
    stop_ = true;
    acceptor_.join();
    kill_all();
    for (auto& [t, done] : pumps_) t.join();
    ::close(listen_fd_);
  }
  void kill_all() {
    std::lock_guard lock(mu_);
    for (auto [a, b] : live_) {
      ::shutdown(a, SHUT_RDWR);
      ::shutdown(b, SHUT_RDWR);
    }
    kills_ += !live_.empty();
  }
  int kills() {
    std::lock_guard lock(mu_);
    return kills_;
  }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      int a = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (a < 0) continue;
      int b = dial(back_);
      if (b < 0) {
        ::close(a);
        continue;
      }
      std::lock_guard lock(mu_);
      pumps_.remove_if([](auto& p) {
        if (!p.second->load()) return false;
        p.first.join();
        return true;
      });
      live_.emplace_back(a, b);
      auto done = std::make_shared<std::atomic<bool>>(false);
      pumps_.emplace_back(std::thread([this, a, b, done] { pump(a, b, *done); }), done);
    }
  }
  void pump(int a, int b, std::atomic<bool>& done) {
    char buf[65536];
    pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    bool open = true;
    while (open && !stop_) {
      if (::poll(p, 2, 20) <= 0) continue;
      for (int i = 0; i < 2 && open; ++i) {
        if (!p[i].revents) continue;
        ssize_t n = ::recv(p[i].fd, buf, sizeof buf, 0);
        open = n > 0;
        for (ssize_t off = 0; open && off < n;) {
          ssize_t w = ::send(p[1 - i].fd, buf + off, size_t(n - off), MSG_NOSIGNAL);
          open = w > 0;
          off += std::max<ssize_t>(w, 0);
        }
      }
    }
    std::lock_guard lock(mu_);
    std::erase(live_, std::pair(a, b));
    ::shutdown(a, SHUT_RDWR);
    ::shutdown(b, SHUT_RDWR);
    ::close(a);
    ::close(b);
    done = true;
  }

  const Address back_;
  int listen_fd_;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::pair<int, int>> live_;  // guarded by mu_: closed only under mu_
  std::list<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> pumps_;  // acceptor only
  int kills_ = 0;                                                              // guarded by mu_
};

TEST(ChannelFault, StreamSurvivesConnectionsShutDownMidFrame) {  // CH-1, CH-2
  TempDir dir;
  Receiver receiver;
  Returns returns;
  IoThreads io(2);
  Net rx(io.io(), test_config(), receiver.fn(), returns.fn());
  auto back = rx.listen(*Address::parse("unix:" + dir.path("back")));
  ASSERT_TRUE(back);
  KillingProxy proxy(dir.path("front"), *back);
  Net tx(io.io(), test_config(), receiver.fn(), returns.fn());
  Address front = *Address::parse("unix:" + dir.path("front"));
  // The stream goes out in batches and the proxy cuts every connection once per batch, at a
  // random point of its delivery: driven by the receiver's progress, not by time, so that a
  // fast run cannot finish before the cuts and a slow (sanitizer) build still finishes.
  constexpr uint64_t kBatches = 40;
  constexpr uint64_t kPerBatch = 2500;
  constexpr uint64_t kCount = kBatches * kPerBatch;
  uint32_t r = 99;
  for (uint64_t b = 0; b < kBatches; ++b) {
    for (uint64_t i = b * kPerBatch; i < (b + 1) * kPerBatch; ++i) {
      tx.send(front, numbered(i, 3000));
    }
    r = r * 1103515245 + 12345;
    const uint64_t cut_at = b * kPerBatch + 1 + (r >> 8) % (kPerBatch - 1);
    ASSERT_TRUE(eventually([&] { return receiver.count() >= cut_at; }, 60s))
        << "batch " << b << ": " << receiver.count() << " arrived, waiting for " << cut_at;
    proxy.kill_all();
  }
  bool all = receiver.wait_for(kCount, 60s);
  ASSERT_TRUE(all) << receiver.count() << " arrived";
  // Once all is acknowledged nothing is resent; once the receiver has stopped, nothing more
  // is delivered: a late duplicate would have shown up as an order error or in the count.
  EXPECT_TRUE(eventually([&] { return tx.unacknowledged(front) == 0; }, 10s));
  rx.stop();
  EXPECT_EQ(receiver.count(), kCount);
  EXPECT_EQ(receiver.error(), "");
  EXPECT_EQ(returns.size(), 0u);
  EXPECT_GT(proxy.kills(), 10);  // each cut found the connection that had just carried data
}

// Waits for one byte on `fd` for up to `limit`; 0 if none came.
char read_byte(int fd, std::chrono::milliseconds limit) {
  pollfd p{fd, POLLIN, 0};
  char c = 0;
  if (::poll(&p, 1, int(limit.count())) == 1 && ::read(fd, &c, 1) == 1) return c;
  return 0;
}

TEST(ChannelFault, StreamBetweenTwoProcesses) {  // CH-1, CH-2 across fork()
  TempDir dir;
  Address addr = *Address::parse("unix:" + dir.path("child.sock"));
  constexpr uint64_t kCount = 100000;
  int up[2], down[2];  // child -> parent, parent -> child
  ASSERT_EQ(::pipe(up), 0);
  ASSERT_EQ(::pipe(down), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::alarm(120);  // a lost parent must not leave the child behind
    Receiver receiver;
    IoThreads io(1);
    Net rx(io.io(), test_config(), receiver.fn(), [](wire::Envelope&&, Error) {});
    char verdict = 'l';
    if (rx.listen(addr)) {
      (void)!::write(up[1], "r", 1);
      bool ok = receiver.wait_for(kCount, 60s) && receiver.error().empty();
      verdict = ok ? 'k' : 'f';
      if (!ok) {
        std::fprintf(stderr, "child: %lu arrived, %s\n", (unsigned long)receiver.count(),
                     receiver.error().c_str());
      }
    }
    (void)!::write(up[1], &verdict, 1);
    read_byte(down[0], 60s);  // stay up until the parent has its acks
    ::_exit(verdict == 'k' ? 0 : 1);
  }
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      for (int i = 0; i < 500; ++i) {
        if (::waitpid(pid, nullptr, WNOHANG) == pid) return;
        std::this_thread::sleep_for(10ms);
      }
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reaper{pid};
  ASSERT_EQ(read_byte(up[0], 10s), 'r');
  Returns returns;
  IoThreads io(1);
  Net tx(io.io(), test_config(), nullptr, returns.fn());
  for (uint64_t i = 0; i < kCount; ++i) tx.send(addr, numbered(i, 10000));
  EXPECT_EQ(read_byte(up[0], 60s), 'k');
  // The last acks are on their way: stop() hands back what they have not reached.
  EXPECT_TRUE(eventually([&] { return tx.unacknowledged(addr) == 0; }, 10s));
  tx.stop();
  EXPECT_EQ(returns.size(), 0u);
  (void)!::write(down[1], "x", 1);
}

}  // namespace
}  // namespace podium::channel
