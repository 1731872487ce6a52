#include "podium/mesh/launch.h"

#include <gtest/gtest.h>
#include <sched.h>

namespace podium::mesh {
namespace {

TEST(Launch, RoundTripsAndRefusesWhatIsMalformed) {  // LA-1
  ProcLaunch l{"/usr/bin/python3", {"python3", "-m", "x"}, {{"A", "1"}}, {"B"}, false,
               {{"cpus", "0-1,3"}, {"membind", "0"}}};
  auto back = ProcLaunch::decode(l.encode());
  ASSERT_TRUE(back) << back.error().to_string();
  EXPECT_EQ(*back, l);
  EXPECT_TRUE(ProcLaunch{}.empty());
  auto empty = ProcLaunch::decode(ProcLaunch{}.encode());
  ASSERT_TRUE(empty);
  EXPECT_TRUE(empty->empty());
  EXPECT_FALSE(ProcLaunch::decode("not msgpack at all"));
  ProcLaunch bad_key{"", {}, {}, {}, true, {{"cores", "0"}}};
  auto refused = ProcLaunch::decode(bad_key.encode());
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("proc_bind key 'cores'"), std::string::npos);
  ProcLaunch bad_env{"", {}, {{"A=B", "1"}}, {}, true, {}};
  EXPECT_FALSE(ProcLaunch::decode(bad_env.encode()));
  ProcLaunch unset_alone{"", {}, {}, {"A"}, true, {}};  // nothing would apply it
  EXPECT_FALSE(ProcLaunch::decode(unset_alone.encode()));
}

TEST(Launch, CpuListsParseAsTasksetWritesThem) {
  EXPECT_EQ(*parse_cpu_list("0-3,8"), (std::vector<int>{0, 1, 2, 3, 8}));
  EXPECT_EQ(*parse_cpu_list("5\n"), (std::vector<int>{5}));
  for (const char* bad : {"", "a", "3-1", "1,", "-1", "1-", "99999"}) {
    auto r = parse_cpu_list(bad);
    EXPECT_FALSE(r) << bad;
  }
  auto bind = decode_bind("cpus=0-1;membind=0");
  ASSERT_TRUE(bind);
  EXPECT_EQ(encode_bind(*bind), "cpus=0-1;membind=0");
  EXPECT_FALSE(decode_bind("cpus"));
  EXPECT_FALSE(decode_bind("cpus=x"));
}

// LA-1: apply_bind binds this (test) process; restored after.
TEST(Launch, ApplyBindSetsTheAffinityOrSaysWhyNot) {
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  int first = -1;
  for (int c = 0; c < CPU_SETSIZE && first < 0; ++c) {
    if (CPU_ISSET(c, &before)) first = c;
  }
  ASSERT_GE(first, 0);
  auto ok = apply_bind("cpus=" + std::to_string(first));
  ASSERT_TRUE(ok) << ok.error().to_string();
  cpu_set_t now;
  ASSERT_EQ(sched_getaffinity(0, sizeof now, &now), 0);
  EXPECT_EQ(CPU_COUNT(&now), 1);
  EXPECT_TRUE(CPU_ISSET(first, &now));
  auto no_node = apply_bind("cpunodebind=999");
  ASSERT_FALSE(no_node);
  EXPECT_NE(no_node.error().message.find("NUMA node 999 does not exist"), std::string::npos);
  ASSERT_EQ(sched_setaffinity(0, sizeof before, &before), 0);
}

}  // namespace
}  // namespace podium::mesh
