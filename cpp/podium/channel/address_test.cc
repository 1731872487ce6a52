#include "podium/channel/address.h"

#include <gtest/gtest.h>

#include <set>

#include "podium/channel/net.h"

namespace podium::channel {
namespace {

TEST(ChannelAddress, ParsesAndPrintsEachTransport) {
  struct Case {
    std::string text;
    Transport transport;
    std::string target;
    uint16_t port;
    std::string printed;
  };
  const Case cases[] = {
      {"inproc:proc0", Transport::kInproc, "proc0", 0, "inproc:proc0"},
      {"inproc:a:b", Transport::kInproc, "a:b", 0, "inproc:a:b"},
      {"unix:/run/podium/x.sock", Transport::kUnix, "/run/podium/x.sock", 0,
       "unix:/run/podium/x.sock"},
      {"unix:rel/x", Transport::kUnix, "rel/x", 0, "unix:rel/x"},
      {"unix:@podium-1", Transport::kUnix, "@podium-1", 0, "unix:@podium-1"},
      {"tcp:127.0.0.1:8080", Transport::kTcp, "127.0.0.1", 8080, "tcp:127.0.0.1:8080"},
      {"tcp:host.example:0", Transport::kTcp, "host.example", 0, "tcp:host.example:0"},
      {"tcp:[::1]:65535", Transport::kTcp, "::1", 65535, "tcp:[::1]:65535"},
      {"tcp:10.0.0.2:4001/9f3a", Transport::kTcp, "10.0.0.2", 4001, "tcp:10.0.0.2:4001/9f3a"},
      {"tcp:[::1]:80/ffffffffffffffff", Transport::kTcp, "::1", 80,
       "tcp:[::1]:80/ffffffffffffffff"},
  };
  for (const Case& c : cases) {
    auto a = Address::parse(c.text);
    ASSERT_TRUE(a) << c.text << ": " << a.error().to_string();
    EXPECT_EQ(a->transport, c.transport) << c.text;
    EXPECT_EQ(a->target, c.target) << c.text;
    EXPECT_EQ(a->port, c.port) << c.text;
    EXPECT_EQ(a->to_string(), c.printed) << c.text;
    auto again = Address::parse(a->to_string());
    ASSERT_TRUE(again) << c.text;
    EXPECT_EQ(*again, *a) << c.text;
  }
}

TEST(ChannelAddress, RejectsMalformedAddressesWithReasons) {
  const std::pair<std::string, std::string> cases[] = {
      {"", "expected inproc:, unix: or tcp:"},
      {"proc0", "expected inproc:, unix: or tcp:"},
      {"udp:1.2.3.4:5", "unknown transport 'udp'"},
      {"inproc:", "empty inproc name"},
      {"unix:", "empty unix path"},
      {"unix:@", "empty unix path"},
      {"unix:/" + std::string(107, 'x'), "exceeds the 107-byte limit"},
      {"tcp:1.2.3.4", "expected tcp:HOST:PORT"},
      {"tcp:1.2.3.4:", "tcp port is not a number"},
      {"tcp:1.2.3.4:65536", "tcp port is not a number"},
      {"tcp:1.2.3.4:-1", "tcp port is not a number"},
      {"tcp:1.2.3.4:80x", "tcp port is not a number"},
      {"tcp::80", "empty tcp host"},
      {"tcp:[]:80", "empty tcp host"},
      {"tcp:::1:80", "IPv6 host in brackets"},
      {"tcp:1.2.3.4:80/", "incarnation is 1 to 16 lowercase hex digits"},
      {"tcp:1.2.3.4:80/0", "incarnation is 1 to 16 lowercase hex digits"},
      {"tcp:1.2.3.4:80/0a", "incarnation is 1 to 16 lowercase hex digits"},
      {"tcp:1.2.3.4:80/12345678901234567", "incarnation is 1 to 16 lowercase hex digits"},
      {"tcp:1.2.3.4:80/9F3A", "incarnation is 1 to 16 lowercase hex digits"},
      {"tcp:1.2.3.4:80/9g", "incarnation is 1 to 16 lowercase hex digits"},
      {"tcp:1.2.3.4:80/-1", "incarnation is 1 to 16 lowercase hex digits"},
  };
  for (const auto& [text, why] : cases) {
    auto a = Address::parse(text);
    ASSERT_FALSE(a) << text;
    EXPECT_TRUE(a.error().is(ChannelErrc::kBadAddress)) << text;
    EXPECT_NE(a.error().message.find(why), std::string::npos) << text << ": " << a.error().message;
  }
  EXPECT_TRUE(Address::parse("unix:/" + std::string(106, 'x')));
}

TEST(ChannelAddress, OrdersAndHashesByValue) {
  auto a = *Address::parse("unix:/a"), b = *Address::parse("unix:/a");
  auto c = *Address::parse("tcp:a:1"), d = *Address::parse("tcp:a:2");
  EXPECT_EQ(a, b);
  EXPECT_NE(c, d);
  EXPECT_EQ(std::hash<Address>()(a), std::hash<Address>()(b));
  EXPECT_NE(std::hash<Address>()(c), std::hash<Address>()(d));
}

// CH-12: a port's next listener is a different address, and every new incarnation is fresh.
TEST(ChannelAddress, IncarnationsTellApartListenersOnOnePort) {
  auto old_one = *Address::parse("tcp:h:7/1"), new_one = *Address::parse("tcp:h:7/2");
  auto plain = *Address::parse("tcp:h:7");
  EXPECT_NE(old_one, new_one);
  EXPECT_NE(old_one, plain);
  EXPECT_NE(std::hash<Address>()(old_one), std::hash<Address>()(new_one));
  EXPECT_EQ(plain.incarnation, 0u);
  std::set<uint64_t> seen;
  for (int i = 0; i < 1000; ++i) {
    uint64_t inc = new_incarnation();
    EXPECT_NE(inc, 0u);
    EXPECT_LE(inc, 0xffffffffULL);
    seen.insert(inc);
  }
  EXPECT_GE(seen.size(), 999u);  // 1000 draws of 32 bits: a repeat is a 1-in-8600 event
}

// CH-24: the worker address forms (Monarch's channel URLs) and what each refuses.
TEST(ChannelAddress, WorkerAddressesParseEveryFormAndRefuseTheRest) {
  auto tcp = parse_worker_address("tcp://10.0.0.2:7000");
  ASSERT_TRUE(tcp) << tcp.error().to_string();
  EXPECT_EQ(tcp->dial, *Address::parse("tcp:10.0.0.2:7000"));
  EXPECT_EQ(tcp->bind, tcp->dial);
  EXPECT_EQ(tcp->fd, -1);
  EXPECT_FALSE(tcp->alias);
  EXPECT_EQ(parse_worker_address("10.0.0.2:7000")->dial, tcp->dial);
  EXPECT_EQ(parse_worker_address("tcp:10.0.0.2:7000")->dial, tcp->dial);
  EXPECT_EQ(parse_worker_address("tcp://[::1]:80")->dial, *Address::parse("tcp:[::1]:80"));

  auto ipc = parse_worker_address("ipc:///tmp/w@1.sock");
  ASSERT_TRUE(ipc) << ipc.error().to_string();
  EXPECT_EQ(ipc->dial, *Address::parse("unix:/tmp/w@1.sock"));
  EXPECT_EQ(parse_worker_address("ipc://worker-3")->dial, *Address::parse("unix:@worker-3"));

  auto fd = parse_worker_address("tcp://node7:fd3");
  ASSERT_TRUE(fd) << fd.error().to_string();
  EXPECT_EQ(fd->fd, 3);
  EXPECT_EQ(fd->bind, *Address::parse("tcp:node7:0"));

  auto alias = parse_worker_address("tcp://worker-fqdn:4444@tcp://0.0.0.0:4444");
  ASSERT_TRUE(alias) << alias.error().to_string();
  EXPECT_TRUE(alias->alias);
  EXPECT_EQ(alias->dial, *Address::parse("tcp:worker-fqdn:4444"));
  EXPECT_EQ(alias->bind, *Address::parse("tcp:0.0.0.0:4444"));
  auto alias_fd = parse_worker_address("tcp://gateway:9000@tcp://0.0.0.0:fd4");
  ASSERT_TRUE(alias_fd);
  EXPECT_EQ(alias_fd->fd, 4);
  EXPECT_EQ(alias_fd->dial.port, 9000);
  auto alias_ipc = parse_worker_address("ipc:///run/a.sock@ipc:///tmp/b.sock");
  ASSERT_TRUE(alias_ipc);
  EXPECT_EQ(alias_ipc->bind, *Address::parse("unix:/tmp/b.sock"));

  for (const char* bad : {"", "udp://h:1", "tcp://h", "tcp://h:fd", "tcp://h:fdx", "tcp://h:fd-1",
                          "ipc://", "tcp://h:1/5", "tcp://h:fd3@tcp://0.0.0.0:1",
                          "tcp://h:1@ipc:///tmp/x.sock", "tcp://h:99999"}) {
    auto r = parse_worker_address(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_NE(r.error().message.find("worker address '" + std::string(bad) + "'"),
              std::string::npos)
        << r.error().message;
  }
  EXPECT_EQ(worker_url(*Address::parse("unix:/tmp/w.sock")), "ipc:///tmp/w.sock");
  EXPECT_EQ(worker_url(*Address::parse("unix:@w")), "ipc://w");
  EXPECT_EQ(worker_url(*Address::parse("tcp:h:7/1f")), "tcp://h:7");
}

}  // namespace
}  // namespace podium::channel
