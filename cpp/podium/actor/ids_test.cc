#include "podium/actor/ids.h"

#include <gtest/gtest.h>

namespace podium::actor {
namespace {

TEST(Ids, ActorIdRoundTripsThroughText) {
  auto addr = channel::Address::parse("unix:/tmp/podium-0/x/p3.sock");
  ASSERT_TRUE(addr) << addr.error().to_string();
  ActorId id{ProcId{*addr}, "counter", 3};
  EXPECT_EQ(id.to_string(), "unix:/tmp/podium-0/x/p3.sock#counter[3]");
  auto back = ActorId::parse(id.to_string());
  ASSERT_TRUE(back) << back.error().to_string();
  EXPECT_EQ(*back, id);
}

TEST(Ids, PortIdOverTcpSplitsAtTheLastColon) {
  auto text = "tcp:127.0.0.1:4000#proc[0]:17";
  auto v = split_port_id(text);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->addr, "tcp:127.0.0.1:4000");
  EXPECT_EQ(v->local_key, "proc[0]");
  EXPECT_EQ(v->port, 17u);
  auto p = PortId::parse(text);
  ASSERT_TRUE(p) << p.error().to_string();
  EXPECT_EQ(p->actor.proc.addr.port, 4000);
  EXPECT_EQ(p->to_string(), text);
}

TEST(Ids, MalformedIdsAreRefusedWithTheText) {
  for (const char* bad : {"", "no-hash", "unix:/x#name", "unix:/x#name[abc]", "unix:/x#[1]",
                          "unix:/x#a[1]:notaport", "unix:/x#a[1]"}) {
    auto p = PortId::parse(bad);
    EXPECT_FALSE(p) << bad;
    if (!p) {
      EXPECT_TRUE(p.error().is(ActorErrc::kBadId)) << p.error().to_string();
    }
  }
  EXPECT_FALSE(ActorId::check_name("a#b"));
  EXPECT_FALSE(ActorId::check_name("a:b"));
  EXPECT_FALSE(ActorId::check_name(""));
  EXPECT_TRUE(ActorId::check_name("trainer-0_x.y"));
}

}  // namespace
}  // namespace podium::actor
