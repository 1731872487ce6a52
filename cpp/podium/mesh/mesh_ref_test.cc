// Tests of mesh refs (mesh_ref.h), rank_info and stop_after (proc_mesh.h): handles turned into
// values and back, the host a rank names, and a proc mesh stopped after other futures.
#include "podium/mesh/mesh_ref.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <stdexcept>
#include <thread>

#include "podium/actor/mesh_failure.h"
#include "podium/mesh/actor_mesh.h"

namespace {

using namespace std::chrono_literals;
namespace mesh = podium::mesh;

class Echo : public podium::Actor {
 public:
  Echo() = default;
  int pid() { return ::getpid(); }
  int64_t where() { return static_cast<int64_t>(rank()); }
  PODIUM_ENDPOINTS(Echo, pid, where)
};
PODIUM_ACTOR(Echo)

template <class T>
T ok(podium::Result<T> r) {
  EXPECT_TRUE(r) << r.error().to_string();
  if (!r) throw std::runtime_error(r.error().to_string());
  return std::move(*r);
}

mesh::ProcMeshRef two_procs() {
  mesh::ProcMeshRef r;
  r.labels = {"hosts", "gpus"};
  r.sizes = {1, 2};
  r.procs = {{"unix:/tmp/podium-no-such-a.sock", 41, "alpha"},
             {"unix:/tmp/podium-no-such-b.sock", 42, "beta"}};
  r.region = ok(podium::ndslice::Region(ok(podium::ndslice::Extent::make(r.labels, r.sizes)))
                    .select("gpus", 1));
  r.spawners = {"unix:/tmp/podium-no-such-mid.sock", "unix:/tmp/podium-no-such-top.sock"};
  return r;
}

TEST(MeshRefCodec, RefsSurviveEncodeAndDecode) {  // MR-1
  auto procs = two_procs();
  EXPECT_EQ(ok(mesh::decode_proc_mesh_ref(mesh::encode(procs))), procs);
  mesh::ActorMeshRef actors;
  actors.name = "echo";
  actors.procs = procs;
  actors.targets = {std::nullopt, mesh::ActorRef{"unix:/tmp/podium-no-such-b.sock",
                                                 "unix:/tmp/podium-no-such-b.sock#echo[1]:0",
                                                 "unix:/tmp/podium-no-such-b.sock#echo[1]",
                                                 "unix:/tmp/podium-no-such-b.sock"}};
  EXPECT_EQ(ok(mesh::decode_actor_mesh_ref(mesh::encode(actors))), actors);
}

TEST(MeshRefCodec, MalformedBytesAreAnErrorNotACrash) {  // MR-1, WI-7
  auto bytes = mesh::encode(two_procs());
  auto cut = podium::Buffer::copy_of(bytes.view().substr(0, bytes.size() / 2));
  auto r = mesh::decode_proc_mesh_ref(cut);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, static_cast<uint16_t>(podium::BaseErrc::kInvalidArgument));
  // A 5-byte array header announcing 2^32 elements.
  auto huge = podium::Buffer::copy_of(std::string_view("\xdd\xff\xff\xff\xff", 5));
  EXPECT_FALSE(mesh::decode_actor_mesh_ref(huge));
  // An actor mesh ref is not a proc mesh ref.
  EXPECT_FALSE(mesh::decode_actor_mesh_ref(bytes));
}

TEST(MeshRefHandles, FromRefChecksWhatItIsGiven) {  // MR-3
  auto r = two_procs();
  r.procs.pop_back();
  auto short_procs = podium::ProcMesh::from_ref(r);
  ASSERT_FALSE(short_procs);
  EXPECT_EQ(short_procs.error().code, static_cast<uint16_t>(podium::BaseErrc::kInvalidArgument));
  // A region of a bigger root mesh addresses base ranks that this one does not have.
  r = two_procs();
  r.region = podium::ndslice::Region(ok(podium::ndslice::Extent::make({"gpus"}, {4})));
  auto outside = podium::ProcMesh::from_ref(r);
  ASSERT_FALSE(outside);
  EXPECT_NE(outside.error().message.find("base rank 2"), std::string::npos)
      << outside.error().message;
  r = two_procs();
  r.procs[0].id = "no address";
  EXPECT_FALSE(podium::ProcMesh::from_ref(r));
  mesh::ActorMeshRef a{"echo", two_procs(), {std::nullopt}};
  auto few_targets = podium::ActorMeshBase::from_ref(a);
  ASSERT_FALSE(few_targets);
  EXPECT_EQ(few_targets.error().code, static_cast<uint16_t>(podium::BaseErrc::kInvalidArgument));
}

TEST(MeshRefHandles, ARefNamesEveryProcsHost) {  // MR-2
  auto ref = podium::this_proc().ref();
  ASSERT_EQ(ref.procs.size(), 1u);
  EXPECT_EQ(ref.procs[0].host, podium::actor::host_name());
  EXPECT_EQ(ref.procs[0].pid, ::getpid());
}

TEST(MeshRefHandles, ARebuiltActorMeshReachesTheSameActors) {  // MR-1
  auto echo = ok(podium::this_proc().spawn<Echo>("echo_ref"));
  ASSERT_TRUE(echo.initialized().get(10s));
  auto again = ok(podium::ActorMeshBase::from_ref(
      ok(mesh::decode_actor_mesh_ref(mesh::encode(echo.ref())))));
  EXPECT_EQ(again.name(), "echo_ref");
  EXPECT_EQ(again.region(), echo.region());
  podium::ActorMesh<Echo> typed(again);
  EXPECT_EQ(ok(typed.call_one(&Echo::pid).get(10s)), ::getpid());
  EXPECT_TRUE(echo.stop(2000ms).get(10s));
}

// The host a rank names is its proc's (ProcInfo::host), never the asking process's: a proc
// mesh whose ref says its proc runs on "elsewhere.example" (here: this process, renamed).
TEST(MeshRankInfo, NamesTheHostOfTheRanksProc) {  // ME-13
  auto ref = podium::this_proc().ref();
  ref.procs[0].host = "elsewhere.example";
  auto procs = ok(podium::ProcMesh::from_ref(ref));
  auto echo = ok(procs.spawn<Echo>("echo_host"));
  ASSERT_TRUE(echo.initialized().get(10s));
  auto info = ok(echo.rank_info(0));
  EXPECT_EQ(info.host, "elsewhere.example");
  EXPECT_NE(info.host, podium::actor::host_name());
  EXPECT_EQ(info.pid, ::getpid());
  EXPECT_EQ(info.base_rank, 0u);
  EXPECT_EQ(info.actor, echo.ref().targets[0]->actor);
  EXPECT_EQ(echo.ref().procs.procs[0].host, "elsewhere.example");  // and its ref says so
  EXPECT_FALSE(echo.rank_info(1));
  EXPECT_TRUE(echo.stop(2000ms).get(10s));
}

TEST(MeshRankInfo, ARankOfASliceNamesItsPlaceInTheProcMesh) {  // ME-13
  auto procs = ok(podium::this_host().spawn_procs({{"procs", 2}}));
  auto echo = ok(procs.spawn<Echo>("echo_slice"));
  ASSERT_TRUE(echo.initialized().get(30s));
  auto info = ok(ok(echo.slice("procs", 1)).rank_info(0));
  EXPECT_EQ(info.base_rank, 1u);
  EXPECT_EQ(info.pid, procs.pid(1));
  EXPECT_EQ(info.host, podium::actor::host_name());  // a local proc: this host, spelled out
  EXPECT_NE(info.point.find("1/2"), std::string::npos) << info.point;
  EXPECT_TRUE(procs.stop(2000ms).get(30s));
}

TEST(MeshStopAfter, StopsOnceEveryFutureIsReadyOrTheWaitPassed) {  // ME-12
  auto procs = ok(podium::this_host().spawn_procs({{"procs", 1}}));
  ASSERT_TRUE(procs.initialized().get(30s));
  podium::actor::Promise<mesh::Replies> never;  // set at the end, long after the wait
  auto t0 = std::chrono::steady_clock::now();
  auto stopped = procs.stop_after({never.future()}, 300ms, 2000ms);
  EXPECT_FALSE(stopped.get(100ms));  // not before the wait
  ASSERT_TRUE(stopped.get(30s));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 300ms);
  EXPECT_TRUE(procs.exit_status(0));
  never.set(mesh::Replies{});  // late: nothing happens twice

  auto more = ok(podium::this_host().spawn_procs({{"procs", 1}}));
  ASSERT_TRUE(more.initialized().get(30s));
  podium::actor::Promise<mesh::Replies> first;
  auto done = more.stop_after({first.future()}, 60s, 2000ms);
  EXPECT_FALSE(done.get(200ms));
  first.set(std::unexpected(podium::make_error(podium::BaseErrc::kInternal, "any outcome")));
  ASSERT_TRUE(done.get(30s));  // long before the 60 s wait
  EXPECT_TRUE(more.exit_status(0));
}

}  // namespace

int main(int argc, char** argv) {
  podium::init(argc, argv);  // spawned procs serve here and never return
  podium::set_unhandled_fault_handler([](podium::actor::MeshFailure) {});
  ::testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  podium::shutdown();
  return rc;
}
