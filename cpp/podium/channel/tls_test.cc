// CH-9: TCP links over mutual TLS 1.3, with certificates made at run time (test_certs.h).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <list>

#include "podium/channel/net.h"
#include "podium/channel/test_certs.h"
#include "podium/channel/test_util.h"

namespace podium::channel {
namespace {

using namespace testing;
using Clock = std::chrono::steady_clock;

const TestCa& job_ca() {
  static const TestCa ca("podium test CA");
  return ca;
}

const TestCa& other_ca() {
  static const TestCa ca("another CA");
  return ca;
}

Config config_with(TlsConfig tls, std::string secret = "") {
  Config c = test_config();
  c.tls = std::move(tls);
  c.secret = std::move(secret);
  return c;
}

// A listener on tcp:127.0.0.1:0 and a dialler, each with its own Config.
struct Pair {
  Pair(Config rx_config, Config tx_config, int threads = 1)
      : rx_io(threads),
        tx_io(threads),
        rx(rx_io.io(), std::move(rx_config), receiver.fn(), rx_returns.fn()),
        tx(tx_io.io(), std::move(tx_config),
           [](wire::Envelope&&) { ADD_FAILURE() << "tx got an envelope"; }, returns.fn()) {
    auto bound = rx.listen(*Address::parse("tcp:127.0.0.1:0"));
    EXPECT_TRUE(bound) << bound.error().to_string();
    if (bound) to = *bound;
  }
  Receiver receiver;
  Returns rx_returns, returns;
  IoThreads rx_io, tx_io;
  Net rx, tx;
  Address to;
};

// Sends one envelope and expects it back with `code` within a second, its reason holding
// each of `words`; nothing reaches the listener.
void expect_refused_fast(Pair& p, ChannelErrc code, std::initializer_list<std::string_view> words) {
  auto t0 = Clock::now();
  p.tx.send(p.to, numbered(0));
  ASSERT_TRUE(p.returns.wait_for(1, 10s)) << "not handed back";
  EXPECT_LT(Clock::now() - t0, 1s);  // refused, not timed out (20 s here)
  auto back = p.returns.take();
  const Error& e = back[0].second;
  EXPECT_TRUE(e.is(code)) << e.to_string();
  for (auto w : words) EXPECT_NE(e.message.find(w), std::string::npos) << e.message;
  EXPECT_EQ(p.receiver.count(), 0u);
}

// The listener still serves a dialler with the right settings.
void expect_still_serving(Pair& p, Config good) {
  Returns returns;
  IoThreads io(1);
  Net net(io.io(), std::move(good), [](wire::Envelope&&) {}, returns.fn());
  net.send(p.to, numbered(0));
  EXPECT_TRUE(p.receiver.wait_for(1, 10s));
  EXPECT_EQ(returns.size(), 0u);
}

TEST(ChannelTls, EnvelopesArriveInOrderOverTls) {  // CH-9 with CH-1, CH-2, CH-4
  Pair p(config_with(job_ca().issue("rx")), config_with(job_ca().issue("tx")), 2);
  // Large parts every 50th envelope: writes the socket cannot take at once, records split
  // across reads.
  for (uint64_t i = 0; i < 3000; ++i) p.tx.send(p.to, numbered(i, 50, 300000));
  ASSERT_TRUE(p.receiver.wait_for(3000, 60s)) << p.receiver.count() << " arrived";
  EXPECT_EQ(p.receiver.error(), "");
  EXPECT_EQ(p.returns.size(), 0u);
}

TEST(ChannelTls, ReconnectsResendOverTls) {  // CH-9 with CH-1, CH-2
  Pair p(config_with(job_ca().issue("rx"), "s"), config_with(job_ca().issue("tx"), "s"));
  for (uint64_t i = 0; i < 2000; ++i) {
    p.tx.send(p.to, numbered(i, 200));
    if (i % 500 == 250) p.tx.reset_connections_for_test();
    if (i % 500 == 400) p.rx.reset_connections_for_test();
  }
  ASSERT_TRUE(p.receiver.wait_for(2000, 60s)) << p.receiver.count() << " arrived";
  EXPECT_EQ(p.receiver.error(), "");
  EXPECT_EQ(p.returns.size(), 0u);
}

TEST(ChannelTls, OnePemWithTheKeyAndTheChainServesAsBoth) {
  TlsConfig tx = job_ca().issue("tx");
  std::string both = tx.key_pem + tx.cert_pem;
  tx.key_pem = tx.cert_pem = both;
  ASSERT_TRUE(check_tls_config(tx));
  Pair p(config_with(job_ca().issue("rx")), config_with(tx));
  p.tx.send(p.to, numbered(0));
  EXPECT_TRUE(p.receiver.wait_for(1, 10s));
}

TEST(ChannelTls, ADiallerWithACertificateFromAnotherCaIsRefusedFast) {  // CH-9
  LogCapture log;
  TlsConfig stranger = other_ca().issue("stranger");
  stranger.ca_pem = job_ca().cert_pem();  // it trusts the listener; the listener not it
  Pair p(config_with(job_ca().issue("rx")), config_with(stranger));
  expect_refused_fast(p, ChannelErrc::kTlsFailed, {"TLS", p.to.to_string(), "unknown ca"});
  EXPECT_TRUE(log.wait_for({"tcp:127.0.0.1:", "refused: TLS handshake failed",
                            "certificate verify failed"},
                           2s));
  expect_still_serving(p, config_with(job_ca().issue("friend")));
}

TEST(ChannelTls, AListenerWithACertificateFromAnotherCaIsNotTrusted) {  // CH-9
  LogCapture log;
  TlsConfig impostor = other_ca().issue("impostor");
  impostor.ca_pem = job_ca().cert_pem();
  Pair p(config_with(impostor), config_with(job_ca().issue("tx")));
  expect_refused_fast(p, ChannelErrc::kTlsFailed,
                      {"TLS handshake with", p.to.to_string(), "certificate verify failed"});
  EXPECT_TRUE(log.wait_for({"tcp:127.0.0.1:", "refused", "alert"}, 2s));
}

TEST(ChannelTls, APlaintextDiallerIsRefusedFast) {  // CH-9
  for (std::string secret : {"", "s"}) {
    SCOPED_TRACE("secret '" + secret + "'");
    LogCapture log;
    Pair p(config_with(job_ca().issue("rx"), secret), config_with({}, secret));
    expect_refused_fast(p, ChannelErrc::kTlsFailed, {p.to.to_string(), "requires TLS"});
    // Without a secret the dialler's Hello reaches the listener; with one, the dialler reads
    // the greeting as a challenge and goes before sending anything.
    EXPECT_TRUE(log.wait_for({"tcp:127.0.0.1:", secret.empty()
                                                     ? "the peer does not speak TLS"
                                                     : "closed the connection before the TLS"},
                             2s));
    expect_still_serving(p, config_with(job_ca().issue("friend"), secret));
  }
}

TEST(ChannelTls, ATlsDiallerToAPlaintextListenerIsRefusedFast) {  // CH-9
  for (std::string secret : {"", "s"}) {
    SCOPED_TRACE("secret '" + secret + "'");
    LogCapture log;
    Pair p(config_with({}, secret), config_with(job_ca().issue("tx"), secret));
    expect_refused_fast(p, ChannelErrc::kTlsFailed, {p.to.to_string(), "does not use TLS"});
    EXPECT_TRUE(log.wait_for({"tcp:127.0.0.1:", "speaks TLS"}, 2s));
    expect_still_serving(p, config_with({}, secret));
  }
}

TEST(ChannelTls, TheSecretIsStillCheckedInsideTls) {  // CH-8 inside CH-9
  {
    LogCapture log;
    Pair p(config_with(job_ca().issue("rx"), "job-secret"),
           config_with(job_ca().issue("tx"), "another-secret"));
    expect_refused_fast(p, ChannelErrc::kAuthFailed, {"refused our secret"});
    EXPECT_TRUE(log.wait_for({"tcp:127.0.0.1:", "authentication failed"}, 2s));
    expect_still_serving(p, config_with(job_ca().issue("friend"), "job-secret"));
  }
  {
    Pair p(config_with(job_ca().issue("rx"), "job-secret"), config_with(job_ca().issue("tx")));
    expect_refused_fast(p, ChannelErrc::kAuthFailed, {"requires authentication", "PODIUM_SECRET"});
  }
  {
    // A listener with a good certificate but no secret does not pass for one of the job's.
    Pair p(config_with(job_ca().issue("rx")), config_with(job_ca().issue("tx"), "job-secret"));
    expect_refused_fast(p, ChannelErrc::kAuthFailed, {"holds no secret"});
  }
}

TEST(ChannelTls, BadSettingsFailListenAndSendWithTheReason) {
  TlsConfig a = job_ca().issue("a"), b = job_ca().issue("b");
  TlsConfig mismatched = a;
  mismatched.key_pem = b.key_pem;
  auto st = check_tls_config(mismatched);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("does not match"), std::string::npos) << st.error().message;
  TlsConfig partial = a;
  partial.ca_pem.clear();
  st = check_tls_config(partial);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("missing: the CA certificate"), std::string::npos);
  TlsConfig garbage{"not a certificate", a.key_pem, a.ca_pem};
  st = check_tls_config(garbage);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("no PEM certificate"), std::string::npos);

  IoThreads io(1);
  Returns returns;
  Net net(io.io(), config_with(garbage), [](wire::Envelope&&) {}, returns.fn());
  auto l = net.listen(*Address::parse("tcp:127.0.0.1:0"));
  ASSERT_FALSE(l);
  EXPECT_TRUE(l.error().is(ChannelErrc::kTlsFailed)) << l.error().to_string();
  net.send(*Address::parse("tcp:127.0.0.1:9"), numbered(0));
  ASSERT_TRUE(returns.wait_for(1, 5s));
  auto back = returns.take();
  EXPECT_TRUE(back[0].second.is(ChannelErrc::kTlsFailed)) << back[0].second.to_string();
  EXPECT_NE(back[0].second.message.find("no PEM certificate"), std::string::npos);
}

TEST(ChannelTls, FilesAreReadByLoadTlsFiles) {
  TempDir dir;
  TlsConfig a = job_ca().issue("a");
  std::ofstream(dir.path("a.pem")) << a.key_pem << a.cert_pem;
  std::ofstream(dir.path("ca.pem")) << a.ca_pem;
  auto c = load_tls_files(dir.path("a.pem"), dir.path("a.pem"), dir.path("ca.pem"));
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_TRUE(check_tls_config(*c));
  auto missing = load_tls_files(dir.path("a.pem"), dir.path("nope.pem"), dir.path("ca.pem"));
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("nope.pem"), std::string::npos);
}

TEST(ChannelTls, UnixLinksStayPlaintext) {  // CH-9 covers TCP only
  TempDir dir;
  IoThreads rx_io(1), tx_io(1);
  Receiver receiver;
  Returns returns;
  Net rx(rx_io.io(), test_config(), receiver.fn(), returns.fn());
  Net tx(tx_io.io(), config_with(job_ca().issue("tx")), [](wire::Envelope&&) {}, returns.fn());
  auto to = rx.listen(*Address::parse("unix:" + dir.path("rx.sock")));
  ASSERT_TRUE(to);
  for (uint64_t i = 0; i < 100; ++i) tx.send(*to, numbered(i));
  EXPECT_TRUE(receiver.wait_for(100, 10s));
  EXPECT_EQ(returns.size(), 0u);
}

// A TCP proxy on 127.0.0.1 that forwards to `port` and records what clients send.
class RecordingProxy {
 public:
  explicit RecordingProxy(uint16_t port) : target_(port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), len) != 0 ||
        ::listen(listen_fd_, 8) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
      ADD_FAILURE() << "proxy: " << std::strerror(errno);
    }
    port_ = ntohs(sa.sin_port);
    accepter_ = std::thread([this] { accept_loop(); });
  }
  ~RecordingProxy() {
    stop_ = true;
    accepter_.join();
    for (auto& t : pumps_) t.join();
    ::close(listen_fd_);
  }
  Address address() const { return *Address::parse("tcp:127.0.0.1:" + std::to_string(port_)); }
  std::string client_bytes() {
    std::lock_guard lock(mu_);
    return recorded_;
  }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      sa.sin_port = htons(target_);
      if (::connect(server, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
        ::close(client);
        ::close(server);
        continue;
      }
      pumps_.emplace_back([this, client, server] { pump(client, server); });
    }
  }
  // Forwards both ways until either side closes or the proxy stops.
  void pump(int client, int server) {
    char buf[65536];
    while (!stop_) {
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (::poll(p, 2, 20) <= 0) continue;
      bool done = false;
      for (int i = 0; i < 2 && !done; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t n = ::read(p[i].fd, buf, sizeof buf);
        if (n <= 0) {
          done = true;
          break;
        }
        if (i == 0) {
          std::lock_guard lock(mu_);
          recorded_.append(buf, size_t(n));
        }
        for (ssize_t off = 0; off < n;) {
          ssize_t w = ::write(p[1 - i].fd, buf + off, size_t(n - off));
          if (w <= 0) {
            done = true;
            break;
          }
          off += w;
        }
      }
      if (done) break;
    }
    ::close(client);
    ::close(server);
  }

  const uint16_t target_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread accepter_;
  std::list<std::thread> pumps_;  // touched by the accepter thread, then by ~RecordingProxy
  std::mutex mu_;
  std::string recorded_;  // guarded by mu_
};

TEST(ChannelTls, ThePayloadIsEncryptedOnTheWire) {  // CH-9
  const std::string marker = "podium-payload-that-must-not-leak-0123456789";
  for (bool tls : {false, true}) {
    SCOPED_TRACE(tls ? "TLS" : "plaintext");
    IoThreads rx_io(1), tx_io(1);
    std::mutex mu;
    std::condition_variable cv;
    std::string got;
    Returns returns;
    Net rx(rx_io.io(), tls ? config_with(job_ca().issue("rx"), "s") : config_with({}, "s"),
           [&](wire::Envelope&& e) {
             std::lock_guard lock(mu);
             got = std::string(e.parts.at(0).view());
             cv.notify_all();
           },
           returns.fn());
    auto bound = rx.listen(*Address::parse("tcp:127.0.0.1:0"));
    ASSERT_TRUE(bound);
    RecordingProxy proxy(bound->port);
    Net tx(tx_io.io(), tls ? config_with(job_ca().issue("tx"), "s") : config_with({}, "s"),
           [](wire::Envelope&&) {}, returns.fn());
    wire::Envelope e = numbered(0);
    e.parts[0] = Buffer::from_string(std::string(marker));
    tx.send(proxy.address(), std::move(e));
    {
      std::unique_lock lock(mu);
      ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return !got.empty(); }));
    }
    EXPECT_EQ(got, marker);  // delivered intact either way
    std::string wire_bytes = proxy.client_bytes();
    EXPECT_GT(wire_bytes.size(), marker.size());
    EXPECT_EQ(wire_bytes.find(marker) != std::string::npos, !tls);
    EXPECT_EQ(returns.size(), 0u);
  }
}

}  // namespace
}  // namespace podium::channel
