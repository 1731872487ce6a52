// The host protocol's messages: round trips and malformed inputs (HP-1), and the sender of
// system messages (the kill check of mesh/host_agent.h, HA-11).
#include "podium/mesh/host_protocol.h"

#include <gtest/gtest.h>

#include "podium/mesh/errc.h"
#include "podium/mesh/launch.h"
#include "podium/ndslice/codec.h"

namespace podium::mesh::proto {
namespace {

channel::Address addr(const char* text) { return *channel::Address::parse(text); }

ndslice::Extent extent() { return *ndslice::Extent::make({"hosts", "gpus"}, {2, 4}); }

template <class T>
void round_trip(const T& m) {
  auto h = m.encode();
  EXPECT_EQ(h.op, T::kOp);
  auto back = T::decode(h);
  ASSERT_TRUE(back) << back.error().to_string();
  EXPECT_TRUE(*back == m) << T::kOp;
}

template <class T>
void refused(const actor::SystemHeader& h, const std::string& says) {
  auto got = T::decode(h);
  ASSERT_FALSE(got) << T::kOp << " decoded a malformed message";
  EXPECT_TRUE(got.error().is(MeshErrc::kProtocol)) << got.error().to_string();
  EXPECT_NE(got.error().message.find(T::kOp), std::string::npos) << got.error().message;
  EXPECT_NE(got.error().message.find(says), std::string::npos) << got.error().message;
}

TEST(HostProtocol, EveryMessageRoundTrips) {  // HP-1
  auto ctl = addr("tcp:10.0.0.1:7000");
  round_trip(HostAttach{ctl, "10.0.0.2", 3, 1, 3000});
  round_trip(HostSpawn{ctl, "trainers", extent(), 9, 4, 4, 4});
  round_trip(HostSpawn{ctl, "", extent(), 9, 4, 0, 8});
  // LA-1: one launch per proc travels with the spawn.
  ProcLaunch launch{"/bin/sh", {"sh", "-c", "exec \"$@\""}, {{"A", "1"}}, {"B"}, false,
                    {{"cpus", "0-1"}, {"membind", "0"}}};
  HostSpawn with_launches{ctl, "", extent(), 9, 4, 0, 2};
  with_launches.launches = {launch.encode(), ProcLaunch{}.encode()};
  round_trip(with_launches);
  round_trip(HostKill{"tcp:10.0.0.2:4000", 9});
  round_trip(HostDetach{ctl, 5, true});
  round_trip(HostDetach{ctl, 5, false});
  round_trip(HostLookup{ctl, "trainers", 6});
  round_trip(ControllerBeat{ctl});
  round_trip(HostAttached{"", "vm2", 3, 1, 4242});
  round_trip(HostAttached{"serves another controller", "vm2", 3, 1, 4242});
  round_trip(HostSpawned{9, "", {{"tcp:10.0.0.2:4000", 11}, {"tcp:10.0.0.2:4001", 12}}});
  round_trip(HostSpawned{9, "no fork for you", {}});
  round_trip(HostSpawned{9, "", {}});  // the answer to a detach
  round_trip(HostFound{6, "", ndslice::encode(extent()), 4,
                       {{"tcp:10.0.0.2:4000", "", 11}, {"tcp:10.0.0.2:4001", "exited with status 3", 12}}});
  round_trip(HostFound{6, "keeps no proc mesh named 'x'", "", 0, {}});
  round_trip(HostProcExit{"tcp:10.0.0.2:4000", 3, 1, 11, true, 9});
  round_trip(HostProcExit{"tcp:10.0.0.2:4000", 3, 1, 11, false, -1});
  round_trip(WorkerBeat{3, 1});
  round_trip(HostOutput{"line\n", 2});
  round_trip(Ready{"unix:/tmp/p.sock", 1, 2, 99});
  round_trip(ProcExit{"unix:/tmp/p.sock", "its proc (pid 3) exited with status 1", 3, true, 0, 1});
  round_trip(KillRequest{"unix:/tmp/p.sock"});
  round_trip(AdoptProcs{ctl});
}

TEST(HostProtocol, MalformedMessagesAreRefusedWithTheirReason) {  // HP-1
  auto ctl = addr("tcp:10.0.0.1:7000");
  // Wrong counts.
  refused<HostAttach>({"host_attach", {"tcp:10.0.0.1:7000"}, {1, 2, 3}},
                      "expected 2 texts and 3 numbers, got 1 and 3");
  refused<HostSpawn>({"host_spawn", {"a", "b"}, {1, 2, 3, 4}}, "expected at least 3 texts");
  refused<HostSpawn>({"host_spawn", {"tcp:10.0.0.1:7000", "", ndslice::encode(extent()), "x"},
                      {1, 2, 0, 2}},
                     "expected no launches or 2, got 1");
  refused<HostKill>({"host_kill", {"k"}, {}}, "expected 1 texts and 1 numbers");
  refused<WorkerBeat>({"host_hb", {}, {1}}, "got 0 and 1");
  // The wrong op.
  refused<HostKill>(HostDetach{ctl, 1, false}.encode(), "not a host_kill message");
  // Fields that do not parse.
  refused<HostAttach>({"host_attach", {"not an address", "h"}, {1, 2, 3}}, "controller");
  refused<HostSpawn>({"host_spawn", {"tcp:10.0.0.1:7000", "", "hosts=2"}, {1, 2, 0, 1}},
                     "bad extent");
  refused<HostSpawn>(HostSpawn{ctl, "", extent(), 1, 2, 6, 4}.encode(), "outside the extent");
  refused<HostKill>({"host_kill", {"k"}, {0}}, "signal 0");
  refused<HostDetach>({"host_detach", {"tcp:10.0.0.1:7000"}, {1, 7}}, "stop is 7");
  refused<HostOutput>({"host_output", {"x"}, {3}}, "fd 3");
  refused<HostProcExit>({"host_proc_exit", {"k"}, {1, 2, 3, 2, 0}}, "signaled is 2");
  // Variable parts that do not agree.
  refused<HostSpawned>({"host_spawned", {"", "tcp:10.0.0.2:4000"}, {9}}, "1 proc addresses but 0 pids");
  refused<HostSpawned>({"host_spawned", {"", "nope"}, {9, 1}}, "'nope' does not parse");
  refused<HostSpawned>({"host_spawned", {"why", "tcp:10.0.0.2:4000"}, {9, 1}}, "an error with procs");
  refused<HostSpawned>({"host_spawned", {}, {}}, "expected at least 1 texts");
  refused<HostFound>({"host_found", {"", ndslice::encode(extent()), "tcp:10.0.0.2:4000"}, {6, 0, 1}},
                     "1 texts for 1 procs");
  refused<HostFound>({"host_found", {"", "junk", "tcp:10.0.0.2:4000", ""}, {6, 0, 1}}, "bad extent");
  refused<HostFound>({"host_found", {""}, {6}}, "no extent");
}

TEST(SystemMessage, CarriesItsSenderAndTheReceiverReadsItExactly) {  // HA-11
  actor::ProcId from{addr("tcp:10.0.0.1:7000")};
  actor::ProcId to{addr("tcp:10.0.0.2:7001")};
  auto env = actor::system_message(from, to, HostKill{"k", 9}.encode());
  EXPECT_EQ(env.sender, actor::system_sender(from));
  auto who = actor::system_sender_proc(env.sender);
  ASSERT_TRUE(who) << who.error().to_string();
  EXPECT_EQ(*who, from);
  // A prefix is not a match: port 700 is not port 7000 (the old starts_with check took it).
  EXPECT_NE(*actor::system_sender_proc(
                actor::system_sender(actor::ProcId{addr("tcp:10.0.0.1:700")})),
            from);
  // No sender, or an actor that is not a proc's system actor, is not a proc.
  EXPECT_FALSE(actor::system_sender_proc(""));
  EXPECT_FALSE(actor::system_sender_proc("tcp:10.0.0.1:7000#counter[0]"));
}

}  // namespace
}  // namespace podium::mesh::proto
