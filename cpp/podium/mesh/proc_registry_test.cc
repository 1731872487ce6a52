// ProcRegistry (proc_registry.h): when the records of dead procs are dropped (ME-11), on
// virtual time: the tests pass the clock in.
#include "podium/mesh/proc_registry.h"

#include <gtest/gtest.h>

#include "podium/actor/ids.h"

namespace podium::mesh {
namespace {

using namespace std::chrono_literals;
using Clock = ProcRegistry::Clock;

constexpr auto kGrace = 30s;

// A mesh of `n` procs named "unix:/run/m<id>-<rank>.sock", registered as a spawn would.
std::shared_ptr<ProcMeshState> spawn(ProcRegistry& reg, uint64_t id, size_t n,
                                     std::shared_ptr<HostMeshState> host = nullptr) {
  auto mesh = std::make_shared<ProcMeshState>();
  mesh->mesh_id = id;
  mesh->procs.resize(n);
  reg.meshes[id] = mesh;
  for (size_t r = 0; r < n; ++r) {
    auto addr = channel::Address::parse("unix:/run/m" + std::to_string(id) + "-" +
                                        std::to_string(r) + ".sock");
    mesh->procs[r].id = actor::ProcId{*addr};
    std::string key = mesh->procs[r].id.to_string();
    reg.by_key[key] = ProcRegistry::ProcRef{mesh, r, host, 0};
    if (host) host->hosts[0].proc_keys.push_back(key);
  }
  return mesh;
}

std::string key_of(const ProcMeshState& mesh, size_t rank) {
  return mesh.procs[rank].id.to_string();
}

Error exited() { return make_error(actor::ActorErrc::kProcExited, "its proc (pid 7) exited"); }

TEST(ProcRegistry, ARecordOutlivesItsMeshHandleByTheGrace) {  // ME-11
  ProcRegistry reg;
  Clock::time_point t0{};
  auto mesh = spawn(reg, 1, 2);
  std::string k0 = key_of(*mesh, 0), k1 = key_of(*mesh, 1);
  ASSERT_TRUE(reg.note_dead(k0, exited(), t0));
  EXPECT_FALSE(reg.note_dead(k0, exited(), t0 + 1s));  // the first reason stays
  ASSERT_TRUE(reg.note_dead(k1, exited(), t0 + 10s));
  EXPECT_EQ(reg.next_sweep(kGrace), t0 + kGrace);

  // Its handle lives: kept past the grace, however often swept.
  EXPECT_TRUE(reg.sweep(t0 + kGrace, kGrace).empty());
  EXPECT_TRUE(reg.sweep(t0 + 100s, kGrace).empty());
  EXPECT_EQ(reg.dead.size(), 2u);
  EXPECT_EQ(reg.dead.at(k0).message, "its proc (pid 7) exited");

  // The handle goes: both are dropped one grace after the sweep that last saw them addressed.
  mesh.reset();
  EXPECT_TRUE(reg.sweep(t0 + 120s, kGrace).empty());
  auto dropped = reg.sweep(t0 + 130s, kGrace);
  ASSERT_EQ(dropped.size(), 2u);
  EXPECT_TRUE(reg.dead.empty());
  EXPECT_TRUE(reg.by_key.empty());
  EXPECT_TRUE(reg.meshes.empty());  // the expired mesh entry went in the same sweep
  EXPECT_EQ(reg.waiting(), 0u);
  EXPECT_EQ(reg.next_sweep(kGrace), std::nullopt);
}

TEST(ProcRegistry, ARecordNothingAddressesGoesAfterTheGrace) {  // ME-11
  ProcRegistry reg;
  Clock::time_point t0{};
  auto host = std::make_shared<HostMeshState>();
  host->hosts.resize(1);
  std::string key = key_of(*spawn(reg, 1, 1, host), 0);  // the handle is dropped at once
  auto port = channel::PortReservation::make("127.0.0.1");
  ASSERT_TRUE(port);
  reg.reservations.emplace(key, std::move(*port));
  reg.note_dead(key, exited(), t0);
  EXPECT_TRUE(reg.sweep(t0 + kGrace - 1ms, kGrace).empty());  // a late call still fails
  EXPECT_TRUE(reg.dead.contains(key));
  auto dropped = reg.sweep(t0 + kGrace, kGrace);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].key, key);
  EXPECT_EQ(dropped[0].host, host);  // the Runtime takes it out of its host's proc_keys
  EXPECT_FALSE(reg.dead.contains(key));
  EXPECT_FALSE(reg.by_key.contains(key));
  EXPECT_FALSE(reg.reservations.contains(key));
}

TEST(ProcRegistry, AViewOfAnotherProcessesMeshKeepsTheRecord) {  // ME-11
  ProcRegistry reg;
  Clock::time_point t0{};
  // A proc that this process only heard of (ME-7), addressed by a handle rebuilt here.
  auto view = std::make_shared<ProcMeshState>();
  view->procs.resize(1);
  view->procs[0].id = actor::ProcId{*channel::Address::parse("unix:/run/other.sock")};
  std::string key = key_of(*view, 0);
  reg.add_view(view);
  reg.note_dead(key, exited(), t0);
  EXPECT_TRUE(reg.addressed(key));
  EXPECT_TRUE(reg.sweep(t0 + kGrace, kGrace).empty());
  view.reset();
  EXPECT_FALSE(reg.addressed(key));
  EXPECT_EQ(reg.sweep(t0 + 2 * kGrace, kGrace).size(), 1u);
  EXPECT_EQ(reg.view_count(), 0u);
}

TEST(ProcRegistry, ViewsOfDroppedHandlesDoNotPileUp) {  // ME-11
  ProcRegistry reg;
  auto mesh = std::make_shared<ProcMeshState>();
  mesh->procs.resize(4);
  for (size_t r = 0; r < 4; ++r) {
    mesh->procs[r].id = actor::ProcId{
        *channel::Address::parse("unix:/run/v-" + std::to_string(r) + ".sock")};
  }
  // A mesh handed to this process with every call: one view per call, each dropped after it.
  for (int i = 0; i < 10000; ++i) {
    auto copy = std::make_shared<ProcMeshState>();
    copy->procs = mesh->procs;
    reg.add_view(copy);
  }
  EXPECT_LT(reg.view_count(), 200u);
}

TEST(ProcRegistry, ViewsAreFoundByEveryProcTheyDescendFromWhileTheyLive) {  // ME-15
  ProcRegistry reg;
  auto view = std::make_shared<ProcMeshState>();
  view->procs.resize(2);
  for (size_t r = 0; r < 2; ++r) {
    view->procs[r].id = actor::ProcId{
        *channel::Address::parse("unix:/run/leaf-" + std::to_string(r) + ".sock")};
  }
  view->spawners = {"unix:/run/mid.sock", "unix:/run/top.sock"};
  auto unrelated = std::make_shared<ProcMeshState>();
  unrelated->procs.resize(1);
  unrelated->procs[0].id = actor::ProcId{*channel::Address::parse("unix:/run/other.sock")};
  reg.add_view(view);
  reg.add_view(unrelated);  // no spawners: found by none
  for (const char* key : {"unix:/run/mid.sock", "unix:/run/top.sock"}) {
    auto found = reg.views_spawned_by(key);
    ASSERT_EQ(found.size(), 1u) << key;
    EXPECT_EQ(found[0], view);
  }
  EXPECT_TRUE(reg.views_spawned_by("unix:/run/leaf-0.sock").empty());
  EXPECT_TRUE(reg.views_spawned_by("unix:/run/other.sock").empty());
  view.reset();  // a dropped handle is found no more
  EXPECT_TRUE(reg.views_spawned_by("unix:/run/mid.sock").empty());
  (void)reg.sweep(Clock::time_point{}, kGrace);
  EXPECT_EQ(reg.view_count(), 1u);
}

TEST(ProcRegistry, ZeroGraceDropsAtTheNextSweepAndDoesNotSpin) {  // ME-11
  ProcRegistry reg;
  Clock::time_point t0{};
  auto kept = spawn(reg, 1, 1);
  std::string k1 = key_of(*spawn(reg, 2, 1), 0);
  reg.note_dead(key_of(*kept, 0), exited(), t0);
  reg.note_dead(k1, exited(), t0);
  auto dropped = reg.sweep(t0, 0s);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].key, k1);
  EXPECT_EQ(reg.waiting(), 1u);
}

TEST(ProcRegistry, TablesStayFlatOverManySpawnStopCycles) {  // ME-11
  ProcRegistry reg;
  Clock::time_point now{};
  for (uint64_t cycle = 1; cycle <= 20000; ++cycle) {
    auto mesh = spawn(reg, cycle, 2);
    for (size_t r = 0; r < 2; ++r) reg.note_dead(key_of(*mesh, r), exited(), now);
    mesh.reset();
    now += 20ms;  // 50 cycles a second
    if (cycle % 100 == 0) reg.sweep(now, kGrace);
  }
  // What died in the last grace (1,500 cycles, 2 procs each) and no more.
  EXPECT_LE(reg.dead.size(), 2u * 1600);
  EXPECT_LE(reg.by_key.size(), 2u * 1600);
  EXPECT_LE(reg.meshes.size(), 100u);
  EXPECT_EQ(reg.waiting(), reg.dead.size());
}

}  // namespace
}  // namespace podium::mesh
