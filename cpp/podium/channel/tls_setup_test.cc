// The connection setup (tls_setup.h) driven alone over a socketpair: both roles, with and
// without TLS, with no io_context, no timer and no sleep. The Net-level tests (net_test.cc,
// tls_test.cc) run the same setup inside SocketLink and Inbound.
#include "podium/channel/tls_setup.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <optional>

#include "podium/channel/test_certs.h"

namespace podium::channel::internal {
namespace {

using Status = TlsSetup::Status;
using Failure = TlsSetup::Failure;

const testing::TestCa& job_ca() {
  static const testing::TestCa ca("podium setup test CA");
  return ca;
}

// One end of the connection: its socket, its TLS session (when on) and its setup.
struct End {
  End(TlsSetup::Role role, int fd, bool tls, const std::string& secret) : fd(fd), secret(secret) {
    if (tls) {
      auto ctx = TlsContext::make(job_ca().issue(role == TlsSetup::Role::kDialler ? "d" : "l"));
      EXPECT_TRUE(ctx) << ctx.error().to_string();
      context = std::move(*ctx);
      auto s = TlsSession::make(*context, role == TlsSetup::Role::kDialler
                                              ? TlsSession::Role::kDialler
                                              : TlsSession::Role::kListener);
      EXPECT_TRUE(s) << s.error().to_string();
      session = std::move(*s);
    }
    setup.emplace(role, session.get(), this->secret, "tcp:peer:1");
  }
  // One read of what the socket holds, if the setup wants it; true when something happened.
  bool step() {
    if (session && session->output_pending()) (void)session->flush(fd);
    if (status != Status::kWantInput) return false;
    auto into = setup->input_space();
    EXPECT_FALSE(into.empty());
    ssize_t n = ::recv(fd, into.data(), into.size(), MSG_DONTWAIT);
    if (n < 0) return false;  // nothing yet
    status = n == 0 ? setup->read_failed(true, "end of file") : setup->input(fd, size_t(n));
    if (status == Status::kFailed) ::shutdown(fd, SHUT_WR);  // as its owner closes
    return true;
  }

  int fd;
  std::string secret;
  std::shared_ptr<TlsContext> context;
  std::unique_ptr<TlsSession> session;
  std::optional<TlsSetup> setup;
  Status status = Status::kWantInput;
};

struct Connection {
  Connection(bool tls, const std::string& dialler_secret, const std::string& listener_secret) {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
    dialler.emplace(TlsSetup::Role::kDialler, fds[0], tls, dialler_secret);
    listener.emplace(TlsSetup::Role::kListener, fds[1], tls, listener_secret);
  }
  ~Connection() {
    ::close(dialler->fd);
    ::close(listener->fd);
  }
  // Starts both ends and runs them until neither moves.
  void run() {
    listener->status = listener->setup->start(listener->fd);
    dialler->status = dialler->setup->start(dialler->fd);
    for (int round = 0; round < 1000; ++round) {
      bool moved = dialler->step();
      moved = listener->step() || moved;
      if (!moved) return;
    }
    ADD_FAILURE() << "the setup did not settle";
  }
  std::optional<End> dialler, listener;
};

TEST(ChannelSetup, BothEndsAgreeInEveryMode) {  // CH-8, CH-9
  struct Mode {
    bool tls;
    std::string secret;
  };
  for (const Mode& m : {Mode{false, "s"}, Mode{true, ""}, Mode{true, "s"}}) {
    SCOPED_TRACE(std::string(m.tls ? "TLS" : "plaintext") + ", secret '" + m.secret + "'");
    Connection c(m.tls, m.secret, m.secret);
    c.run();
    EXPECT_EQ(c.dialler->status, Status::kReady) << c.dialler->setup->why();
    EXPECT_EQ(c.listener->status, Status::kReady) << c.listener->setup->why();
  }
}

TEST(ChannelSetup, AWrongSecretFailsBothEndsWithTheirReasons) {  // CH-8, CH-18
  for (bool tls : {false, true}) {
    SCOPED_TRACE(tls ? "TLS" : "plaintext");
    Connection c(tls, "another", "job");
    c.run();
    ASSERT_EQ(c.listener->status, Status::kFailed);
    EXPECT_EQ(c.listener->setup->failure(), Failure::kAuth);
    EXPECT_NE(c.listener->setup->why().find("authentication failed"), std::string::npos)
        << c.listener->setup->why();
    ASSERT_EQ(c.dialler->status, Status::kFailed);
    EXPECT_EQ(c.dialler->setup->failure(), Failure::kAuth);
    EXPECT_NE(c.dialler->setup->why().find("tcp:peer:1 refused our secret"), std::string::npos)
        << c.dialler->setup->why();
  }
}

TEST(ChannelSetup, ASecretOnOneSideOnlyFailsInsideTls) {  // CH-8 inside CH-9, CH-18
  Connection without(true, "", "job");
  without.run();
  ASSERT_EQ(without.dialler->status, Status::kFailed);
  EXPECT_EQ(without.dialler->setup->failure(), Failure::kAuth);
  EXPECT_NE(without.dialler->setup->why().find("PODIUM_SECRET"), std::string::npos);
  Connection impostor(true, "job", "");
  impostor.run();
  ASSERT_EQ(impostor.dialler->status, Status::kFailed);
  EXPECT_NE(impostor.dialler->setup->why().find("holds no secret"), std::string::npos);
}

TEST(ChannelSetup, AListenerThatGoesFailsTheDiallerAsTheConnectionsFault) {  // CH-18
  Connection c(false, "job", "job");
  ::shutdown(c.listener->fd, SHUT_RDWR);
  c.dialler->status = c.dialler->setup->start(c.dialler->fd);
  EXPECT_TRUE(c.dialler->step());
  ASSERT_EQ(c.dialler->status, Status::kFailed);
  EXPECT_EQ(c.dialler->setup->failure(), Failure::kPeer);  // retried, not refused
  EXPECT_NE(c.dialler->setup->why().find("connection closed by peer"), std::string::npos);
}

// The listener reads the dialler's response, then ends before its verdict: with nothing sent,
// or with a part of a verdict.
Status dialler_after_a_listener_that_ends(Connection& c, size_t verdict_bytes) {
  End& d = *c.dialler;
  End& l = *c.listener;
  l.status = l.setup->start(l.fd);
  d.status = d.setup->start(d.fd);
  EXPECT_TRUE(d.step());  // the challenge, answered
  EXPECT_EQ(d.status, Status::kWantInput);
  std::array<char, kResponseBytes> response{};
  EXPECT_EQ(::recv(l.fd, response.data(), response.size(), 0), ssize_t(kResponseBytes));
  std::string part(verdict_bytes, '\x01');
  if (!part.empty()) {
    EXPECT_EQ(::send(l.fd, part.data(), part.size(), 0), ssize_t(part.size()));
  }
  ::shutdown(l.fd, SHUT_RDWR);  // as a killed process's socket closes
  while (d.status == Status::kWantInput && d.step()) {
  }
  return d.status;
}

TEST(ChannelSetup, AListenerThatEndsBeforeItsVerdictIsTheConnectionsFault) {  // CH-28
  Connection gone(false, "job", "job");
  ASSERT_EQ(dialler_after_a_listener_that_ends(gone, 0), Status::kFailed);
  EXPECT_EQ(gone.dialler->setup->failure(), Failure::kPeer);  // retried, not refused
  EXPECT_NE(gone.dialler->setup->why().find("closed the connection before its verdict"),
            std::string::npos)
      << gone.dialler->setup->why();
  Connection cut(false, "job", "job");
  ASSERT_EQ(dialler_after_a_listener_that_ends(cut, 5), Status::kFailed);
  EXPECT_EQ(cut.dialler->setup->failure(), Failure::kAuth);  // a refusal cut short
  EXPECT_NE(cut.dialler->setup->why().find("during authentication"), std::string::npos)
      << cut.dialler->setup->why();
}

// The test plays the other side by hand, in plaintext, and sends its last setup bytes and
// what follows them in one write.
std::string rest_of_socket(int fd) {
  char buf[64];
  ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
  return n > 0 ? std::string(buf, size_t(n)) : std::string();
}

TEST(ChannelSetup, APlaintextListenerReadsNoFurtherThanTheResponse) {  // CH-17
  Connection c(false, "job", "job");
  End& l = *c.listener;
  l.status = l.setup->start(l.fd);
  ASSERT_EQ(l.status, Status::kWantInput);
  std::array<uint8_t, kChallengeBytes> challenge{};
  ASSERT_EQ(::recv(c.dialler->fd, challenge.data(), challenge.size(), 0), ssize_t(kChallengeBytes));
  Nonce server{};
  ASSERT_TRUE(parse_challenge(challenge, server));
  auto client = random_nonce();
  ASSERT_TRUE(client);
  auto response = auth_response("job", server, *client);
  ASSERT_TRUE(response);
  std::string bytes(reinterpret_cast<const char*>(response->data()), response->size());
  bytes += "first frame";
  ASSERT_EQ(::send(c.dialler->fd, bytes.data(), bytes.size(), 0), ssize_t(bytes.size()));
  while (l.status == Status::kWantInput && l.step()) {
  }
  ASSERT_EQ(l.status, Status::kReady) << l.setup->why();
  EXPECT_EQ(rest_of_socket(l.fd), "first frame");
}

TEST(ChannelSetup, APlaintextDiallerReadsNoFurtherThanTheVerdict) {  // CH-17
  Connection c(false, "job", "job");
  End& d = *c.dialler;
  d.status = d.setup->start(d.fd);
  Nonce server{};
  server[0] = 7;
  auto challenge = auth_challenge(server);
  ASSERT_EQ(::send(c.listener->fd, challenge.data(), challenge.size(), 0),
            ssize_t(challenge.size()));
  ASSERT_TRUE(d.step());
  ASSERT_EQ(d.status, Status::kWantInput) << d.setup->why();
  Response response{};
  ASSERT_EQ(::recv(c.listener->fd, response.data(), response.size(), 0), ssize_t(kResponseBytes));
  Nonce client{};
  ASSERT_EQ(verify_response("job", server, response, client), true);
  auto verdict = auth_verdict(true, "job", client, server);
  ASSERT_TRUE(verdict);
  std::string bytes(reinterpret_cast<const char*>(verdict->data()), verdict->size());
  bytes += "HelloAck";
  ASSERT_EQ(::send(c.listener->fd, bytes.data(), bytes.size(), 0), ssize_t(bytes.size()));
  while (d.status == Status::kWantInput && d.step()) {
  }
  ASSERT_EQ(d.status, Status::kReady) << d.setup->why();
  EXPECT_EQ(rest_of_socket(d.fd), "HelloAck");
}

}  // namespace
}  // namespace podium::channel::internal
