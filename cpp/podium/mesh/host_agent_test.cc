// A HostAgent on a real proc, driven over TCP by a controller proc and a stranger proc: only
// the controller it serves commands it (HA-11), and what others send is refused and logged.
// Its "procs" are `sleep` processes (they never register; the agent only starts and kills).
#include "podium/mesh/host_agent.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <future>
#include <thread>

#include "podium/actor/message.h"
#include "podium/host/child_watcher.h"

namespace podium::mesh {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<actor::Proc> make_proc() {
  auto p = actor::Proc::make(actor::ProcConfig{*channel::Address::parse("tcp:127.0.0.1:0"), {}});
  if (!p) throw std::runtime_error(p.error().to_string());
  return std::move(*p);
}

template <class F>
bool eventually(F cond, std::chrono::milliseconds bound = 10s) {
  auto until = std::chrono::steady_clock::now() + bound;
  while (std::chrono::steady_clock::now() < until) {
    if (cond()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return cond();
}

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

// A proc that collects the worker's answers of one op.
struct Peer {
  std::unique_ptr<actor::Proc> proc = make_proc();
  std::mutex mu;
  std::vector<actor::SystemHeader> got;  // guarded by mu

  explicit Peer(std::initializer_list<const char*> ops) {
    for (const char* op : ops) {
      proc->on_system(op, [this](const actor::SystemHeader& h, wire::Envelope&&) {
        std::lock_guard lock(mu);
        got.push_back(h);
      });
    }
    proc->on_system("host_hb", [](const actor::SystemHeader&, wire::Envelope&&) {});
  }
  void send(const actor::Proc& to, const actor::SystemHeader& h) {
    proc->send(to.id().addr, actor::system_message(proc->id(), to.id(), h));
  }
  std::optional<actor::SystemHeader> first(const std::string& op) {
    std::lock_guard lock(mu);
    for (auto& h : got) {
      if (h.op == op) return h;
    }
    return std::nullopt;
  }
};

TEST(HostAgent, AKillFromAnotherProcIsRefusedAndLoggedAndTheControllersIsObeyed) {  // HA-11
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  spdlog::default_logger()->sinks().push_back(sink);
  auto logged = [&](const std::string& text) {
    for (const auto& line : sink->last_formatted()) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  };
  auto worker = make_proc();
  host::ChildWatcher watcher(worker->io());
  ProcSpawner spawner(worker->io(), watcher, {"/bin/sleep", "600"}, {});
  spawner.start();
  OutputWriter output;
  HostAgent agent(*worker, spawner, output, false);
  ASSERT_TRUE(agent.start());
  Peer controller({"host_attached", "host_spawned"});
  Peer stranger({"host_attached", "host_spawned"});
  auto ctl = controller.proc->id().addr;

  controller.send(*worker, proto::HostAttach{ctl, "127.0.0.1", 1, 0, 60000}.encode());
  ASSERT_TRUE(eventually([&] { return controller.first("host_attached").has_value(); }));
  auto attached = proto::HostAttached::decode(*controller.first("host_attached"));
  ASSERT_TRUE(attached);
  EXPECT_EQ(attached->refusal, "");

  auto extent = *ndslice::Extent::make({"gpus"}, {1});
  controller.send(*worker, proto::HostSpawn{ctl, "", extent, 7, 1, 0, 1}.encode());
  ASSERT_TRUE(eventually([&] { return controller.first("host_spawned").has_value(); }));
  auto spawned = proto::HostSpawned::decode(*controller.first("host_spawned"));
  ASSERT_TRUE(spawned) << spawned.error().to_string();
  ASSERT_EQ(spawned->error, "");
  ASSERT_EQ(spawned->procs.size(), 1u);
  pid_t pid = static_cast<pid_t>(spawned->procs[0].pid);
  std::string key = spawned->procs[0].key;
  ASSERT_TRUE(alive(pid));

  // A stranger's kill: refused, logged naming it, and the proc lives.
  stranger.send(*worker, proto::HostKill{key, SIGKILL}.encode());
  ASSERT_TRUE(eventually([&] { return agent.refused() == 1; }));
  // refuse() counts, then logs: wait for the lines, bounded.
  EXPECT_TRUE(eventually([&] {
    return logged("refused host_kill from " + actor::system_sender(stranger.proc->id()));
  }));
  EXPECT_TRUE(eventually([&] { return logged("is not the controller this worker serves"); }));
  // A stranger's spawn carries a request: it is answered with the refusal.
  stranger.send(*worker, proto::HostSpawn{stranger.proc->id().addr, "", extent, 8, 2, 0, 1}.encode());
  ASSERT_TRUE(eventually([&] { return stranger.first("host_spawned").has_value(); }));
  auto refused = proto::HostSpawned::decode(*stranger.first("host_spawned"));
  ASSERT_TRUE(refused);
  EXPECT_NE(refused->error.find("is not the controller this worker serves"), std::string::npos)
      << refused->error;
  // A malformed kill, even from the controller, is refused with its reason (HP-1).
  controller.send(*worker, actor::SystemHeader{"host_kill", {key}, {}});
  ASSERT_TRUE(eventually([&] { return agent.refused() == 3; }));
  EXPECT_TRUE(eventually([&] { return logged("host_kill: expected 1 texts and 1 numbers"); }));
  // No wait needed: a refusal is counted once its handler has decided (it kills nothing
  // after), and all three kills were counted above.
  EXPECT_TRUE(alive(pid));

  // The controller's kill is obeyed: the proc ends (the watcher reaps it).
  controller.send(*worker, proto::HostKill{key, SIGKILL}.encode());
  EXPECT_TRUE(eventually([&] { return !alive(pid); }));

  agent.stop();
  spawner.stop();
  watcher.stop();
  stranger.proc->stop();
  controller.proc->stop();
  worker->stop();
  output.stop();
  auto& sinks = spdlog::default_logger()->sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
}

}  // namespace
}  // namespace podium::mesh
