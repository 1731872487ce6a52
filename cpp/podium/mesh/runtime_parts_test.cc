// The runtime's parts on their own: the boot line (BT-1), the spawn commands (BT-3), the job
// thread behind the spawner (PS-1, PS-2), the output writer (HA-12) and the controller's host
// table (HA-13).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "podium/mesh/bootstrap.h"
#include "podium/mesh/host_client.h"
#include "podium/mesh/host_output.h"
#include "podium/mesh/proc_spawner.h"

namespace podium::mesh {
namespace {

using namespace std::chrono_literals;

TEST(Boot, RoundTripsAndRefusesWhatIsNotABootLine) {  // BT-1
  Boot b{*channel::Address::parse("tcp:10.0.0.1:7000"), *channel::Address::parse("tcp:10.0.0.2:4000"),
         3, 5, true};
  auto back = Boot::decode(b.encode());
  ASSERT_TRUE(back) << back.error().to_string();
  EXPECT_EQ(*back, b);
  b.reuse_port = false;
  EXPECT_EQ(*Boot::decode(b.encode()), b);
  for (const char* bad : {"", "a;b;c", "unix:/x;unix:/y;1;2;reuse", "unix:/x;unix:/y;one;2",
                          "unix:/x;unix:/y;1;", "nope;unix:/y;1;2"}) {
    auto got = Boot::decode(bad);
    ASSERT_FALSE(got) << bad;
    EXPECT_NE(got.error().message.find("PODIUM_BOOT"), std::string::npos) << got.error().message;
  }
}

TEST(SpawnCommands, RoundTripAndRefuseWhatIsNotTheirEncoding) {  // BT-3
  for (const SpawnCommands& c :
       {SpawnCommands{{"/usr/bin/python3", "-m", "podium._src.proc"},
                      {"/usr/bin/python3", "-m", "podium._src.zygote"}},
        SpawnCommands{{"/bin/prog"}, {}},
        SpawnCommands{{"/a b/x", "", "with:colon,comma;semi", std::string("\x1f\n", 2)}, {"z"}}}) {
    auto back = SpawnCommands::decode(c.encode());
    ASSERT_TRUE(back) << back.error().to_string();
    EXPECT_EQ(*back, c);
  }
  for (const char* bad : {"", "1,0,", "0,0,", "1,0,5:abc", "1,0,3:abcd", "x,0,1:a", "1,1,1:a",
                          "1,0,1:a,", "1;0;1:a", "1,0,-1:a"}) {
    auto got = SpawnCommands::decode(bad);
    ASSERT_FALSE(got) << bad;
    EXPECT_NE(got.error().message.find("PODIUM_SPAWN"), std::string::npos) << got.error().message;
  }
}

TEST(Lineage, RoundTripAndRefuseWhatIsNotItsEncoding) {  // BT-5
  using Keys = std::vector<std::string>;
  for (const Keys& keys : {Keys{}, Keys{"unix:/tmp/podium-0/1-ab/m1-0.sock"},
                           Keys{"tcp:127.0.0.1:4000/1a2b", "unix:/a:b;c\n/x.sock"}}) {
    auto back = decode_lineage(encode_lineage(keys));
    ASSERT_TRUE(back) << back.error().to_string();
    EXPECT_EQ(*back, keys);
  }
  for (const char* bad : {"x", "3:ab", "0:", "1:a2", ":a", "1a:b", "-1:a", "1234567890:a"}) {
    auto got = decode_lineage(bad);
    ASSERT_FALSE(got) << bad;
    EXPECT_NE(got.error().message.find("PODIUM_LINEAGE"), std::string::npos)
        << got.error().message;
  }
}

TEST(JobThread, RunsJobsInOrderAndRunsInlineFromItself) {
  JobThread t("test");
  t.start();
  std::vector<int> seen;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(t.post([&seen, i] { seen.push_back(i); }));
  auto r = t.run<int>([&]() -> Result<int> {
    // From the thread itself: inline, no deadlock.
    return t.run<int>([]() -> Result<int> { return 7; }, 1s);
  }, 5s);
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, 7);
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(JobThread, AWaitIsBoundedAndAJobNotStartedNeverRuns) {  // PS-1
  JobThread t("test");
  t.start();
  std::atomic<bool> release{false};
  ASSERT_TRUE(t.post([&] {
    while (!release) std::this_thread::sleep_for(1ms);
  }));
  std::atomic<bool> ran{false};
  auto r = t.run<int>([&]() -> Result<int> {
    ran = true;
    return 1;
  }, 50ms);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(MeshErrc::kSpawnFailed)) << r.error().to_string();
  EXPECT_NE(r.error().message.find("did not run the job within 50 ms"), std::string::npos);
  release = true;
  // A later job runs: the one given up on was taken out, not run.
  auto later = t.run<int>([]() -> Result<int> { return 2; }, 5s);
  ASSERT_TRUE(later);
  EXPECT_FALSE(ran);
}

TEST(JobThread, StopJoinsAndRefusesAfterwards) {  // PS-2
  JobThread t("test");
  t.start();
  std::atomic<bool> release{false};
  ASSERT_TRUE(t.post([&] {
    while (!release) std::this_thread::sleep_for(1ms);
  }));
  // A waiter queued behind a busy job learns of the stop at once, not at its timeout.
  std::optional<Result<int>> waited;
  std::thread waiter([&] { waited = t.run<int>([]() -> Result<int> { return 1; }, 60s); });
  std::this_thread::sleep_for(20ms);
  std::thread stopper([&] { t.stop(); });
  std::this_thread::sleep_for(20ms);
  release = true;
  stopper.join();
  waiter.join();
  ASSERT_TRUE(waited.has_value());
  ASSERT_FALSE(*waited);
  EXPECT_TRUE(waited->error().is(MeshErrc::kShutDown)) << waited->error().to_string();
  EXPECT_FALSE(t.post([] {}));
  auto r = t.run<int>([]() -> Result<int> { return 1; }, 1s);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(MeshErrc::kShutDown));
}

TEST(OutputWriter, AFullPipeNeverBlocksTheCallerAndDropsAreCounted) {  // HA-12
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  // Nobody reads fds[0]: the pipe fills, the writer thread waits, the queue fills.
  OutputWriter w;
  std::string chunk(64 * 1024, 'x');
  auto start = std::chrono::steady_clock::now();
  size_t n = 2 * OutputWriter::kMaxQueuedBytes / chunk.size();
  for (size_t i = 0; i < n; ++i) w.write(fds[1], chunk);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);  // write() only queues
  EXPECT_GT(w.dropped_bytes(), 0u);
  EXPECT_EQ(w.dropped_bytes() % chunk.size(), 0u);
  auto stop_start = std::chrono::steady_clock::now();
  w.stop();  // gives a blocked fd up: bounded
  EXPECT_LT(std::chrono::steady_clock::now() - stop_start, 10s);
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST(HostTable, AHostMeshWhoseHostsAllFailedLeavesAfterTheGrace) {  // HA-13
  HostTable t;
  auto now = std::chrono::steady_clock::now();
  auto a = std::make_shared<HostMeshState>();
  auto b = std::make_shared<HostMeshState>();
  a->hosts.resize(2);
  b->hosts.resize(1);
  std::vector<channel::Address> wa{*channel::Address::parse("tcp:10.0.0.1:7000"),
                                   *channel::Address::parse("tcp:10.0.0.2:7000")};
  std::vector<channel::Address> wb{*channel::Address::parse("tcp:10.0.0.3:7000")};
  t.add(a, wa, now);
  t.add(b, wb, now);
  EXPECT_EQ(t.meshes.size(), 2u);
  EXPECT_EQ(t.by_worker.size(), 3u);
  a->hosts[0].failure = "lost";
  EXPECT_EQ(t.prune(now, 30s), 0u);  // one host of `a` is still usable
  a->hosts[1].failure = "it was shut down";
  EXPECT_EQ(t.prune(now + 1s, 30s), 0u);  // all failed: the grace starts now
  EXPECT_EQ(t.prune(now + 20s, 30s), 0u);
  EXPECT_EQ(t.prune(now + 32s, 30s), 1u);
  EXPECT_EQ(t.meshes.size(), 1u);
  EXPECT_EQ(t.heard.size(), 1u);
  EXPECT_EQ(t.by_worker.size(), 1u);
  EXPECT_TRUE(t.by_worker.contains(wb[0].to_string()));
  EXPECT_TRUE(t.done_since.empty());
  // Requests leave when answered or given up on: the table holds only open ones.
  auto [req, answer] = t.new_request();
  EXPECT_EQ(t.requests.size(), 1u);
  t.requests.erase(req);
  EXPECT_TRUE(t.requests.empty());
}

}  // namespace
}  // namespace podium::mesh
