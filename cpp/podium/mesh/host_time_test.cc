// The mesh layer's timers on virtual time (docs/host_agent.md, "Time"): a controller runtime
// and a HostAgent whose clock is a base::ManualClock, talking over TCP to a scripted peer on
// the real clock. Time moves only through advance(), which runs every timer that falls due
// before it returns, so a verdict is checked at its deadline exactly, and "not before" is
// checked just below it, with no sleep: the lost-host verdicts (HA-4, HA-5), the attach
// timeout (HA-3, HA-10) and the dead records' sweep (ME-11).
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "podium/actor/message.h"
#include "podium/base/clock.h"
#include "podium/host/child_watcher.h"
#include "podium/mesh/host_agent.h"
#include "podium/mesh/runtime_impl.h"

namespace podium::mesh {
namespace {

using namespace std::chrono_literals;

// A condition polled with a bound (real time: it waits for other threads, not for timers).
template <class F>
bool eventually(F cond, std::chrono::milliseconds bound = 10s) {
  auto until = std::chrono::steady_clock::now() + bound;
  while (std::chrono::steady_clock::now() < until) {
    if (cond()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return cond();
}

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

channel::Address tcp_any() { return *channel::Address::parse("tcp:127.0.0.1:0"); }

// No secret and no TLS on either side: the test's procs talk plainly.
void plain_job() {
  ::unsetenv("PODIUM_SECRET");
  ::unsetenv("PODIUM_SECRET_FILE");
}

// A proc on the real clock that plays the other end of the protocol: it records what it is
// sent, and answers what `answers` says.
struct Peer {
  std::unique_ptr<actor::Proc> proc;
  std::mutex mu;
  std::vector<actor::SystemHeader> got;  // guarded by mu
  bool answer_attach = true;

  Peer() {
    auto p = actor::Proc::make(actor::ProcConfig{tcp_any(), {}});
    if (!p) throw std::runtime_error(p.error().to_string());
    proc = std::move(*p);
    for (const char* op : {"host_attach", "host_detach", "host_hb", "host_attached",
                           "host_spawn", "host_spawned", "host_proc_exit"}) {
      proc->on_system(op, [this](const actor::SystemHeader& h, wire::Envelope&& env) {
        on(h, env.sender);
      });
    }
  }
  ~Peer() { proc->stop(); }

  void on(const actor::SystemHeader& h, const std::string& sender) {
    {
      std::lock_guard lock(mu);
      got.push_back(h);
    }
    auto who = actor::system_sender_proc(sender);
    if (!who) return;
    if (h.op == proto::HostAttach::kOp && answer_attach) {
      auto m = proto::HostAttach::decode(h);
      if (m) send(who->addr, proto::HostAttached{"", "vhost", m->host_mesh, m->host_index, 1}.encode());
    } else if (h.op == proto::HostDetach::kOp) {
      auto m = proto::HostDetach::decode(h);
      if (m) send(who->addr, proto::HostSpawned{m->request, "", {}}.encode());
    }
  }
  void send(const channel::Address& to, const actor::SystemHeader& h) {
    proc->send(to, actor::system_message(proc->id(), actor::ProcId{to}, h));
  }
  const channel::Address& addr() const { return proc->id().addr; }
  size_t count(const std::string& op) {
    std::lock_guard lock(mu);
    return std::count_if(got.begin(), got.end(), [&](const auto& h) { return h.op == op; });
  }
};

// A controller runtime (not published as the process's) on a ManualClock.
struct Controller {
  std::shared_ptr<base::ManualClock> clock = std::make_shared<base::ManualClock>();
  std::unique_ptr<Runtime> rt;

  Controller() {
    plain_job();
    RuntimeConfig c;
    c.listen = tcp_any();
    c.clock = clock;
    c.fault_handler = [](actor::MeshFailure) {};
    auto r = make_runtime(std::move(c));
    if (!r) throw std::runtime_error(r.error().to_string());
    rt = std::move(*r);
    rt->proc().serve_held_system_ops();
  }
  ~Controller() { rt->shutdown(); }
  Runtime::Impl& impl() { return rt->impl(); }
  // The host timer's first tick (posted by attach) has run: every verdict is timed from now.
  bool ticking() {
    std::lock_guard lock(impl().mu);
    return impl().next_beat != base::SteadyTime{};
  }
  static std::optional<std::string> failure(HostMeshState& hm, size_t i = 0) {
    std::lock_guard lock(hm.mu);
    return hm.hosts[i].failure;
  }
};

TEST(HostTime, AControllerDeclaresASilentHostLostExactlyAtLostAfter) {  // HA-4
  Controller ctl;
  Peer worker;
  ctl.impl().host_lost_after = 3000ms;
  auto hm = ctl.rt->attach({worker.addr()});
  ASSERT_TRUE(hm) << hm.error().to_string();
  auto& h = **hm;
  ASSERT_TRUE(h.initialized.get(10s)) << "the scripted worker answers the attach";
  ASSERT_TRUE(eventually([&] { return ctl.ticking(); }));
  auto t0 = ctl.clock->now();  // the host was heard from (host_attached) at t0

  // Heartbeats go out every lost-after / 6; the host stays attached until lost-after.
  ctl.clock->advance(3000ms - 1ms);
  EXPECT_FALSE(Controller::failure(h)) << *Controller::failure(h);
  EXPECT_TRUE(eventually([&] { return worker.count("host_hb") >= 5; }))
      << worker.count("host_hb") << " heartbeats";
  // The worker's own beat now moves its deadline: lost-after from this beat.
  worker.send(ctl.rt->proc().id().addr, proto::WorkerBeat{h.id, 0}.encode());
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(ctl.impl().mu);
    return ctl.impl().hosts.heard[&h][0] == ctl.clock->now();
  }));
  auto beat = ctl.clock->now();
  EXPECT_EQ(beat - t0, 3000ms - 1ms);
  ctl.clock->advance(3000ms - 1ms);
  EXPECT_FALSE(Controller::failure(h)) << "lost before lost-after had passed";
  ctl.clock->advance(1ms);
  auto why = Controller::failure(h);
  ASSERT_TRUE(why) << "not lost once lost-after had passed";
  EXPECT_EQ(*why, "no heartbeat for 3.0 s");
  EXPECT_EQ(ctl.clock->now() - beat, 3000ms);
}

TEST(HostTime, AnUnansweredAttachFailsExactlyAtTheAttachTimeoutAndIsReleased) {  // HA-3, HA-10
  Controller ctl;
  Peer worker;
  worker.answer_attach = false;
  ctl.impl().attach_timeout = 10000ms;
  auto hm = ctl.rt->attach({worker.addr()});
  ASSERT_TRUE(hm) << hm.error().to_string();
  ASSERT_TRUE(eventually([&] { return ctl.ticking() && worker.count("host_attach") == 1; }));
  ctl.clock->advance(10000ms - 1ms);
  EXPECT_FALSE((*hm)->initialized.ready());
  EXPECT_EQ(worker.count("host_detach"), 0u);
  ctl.clock->advance(1ms);
  ASSERT_TRUE((*hm)->initialized.ready());
  auto r = (*hm)->initialized.get();
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(MeshErrc::kHostLost)) << r.error().to_string();
  EXPECT_NE(r.error().message.find("no answer within 10.0 s (unreachable, or not a podium worker)"),
            std::string::npos)
      << r.error().message;
  // HA-10: the worker is told the attach was given up on, behind the attach.
  EXPECT_TRUE(eventually([&] { return worker.count("host_detach") == 1; }));
}

TEST(HostTime, ASpawnAHostNeverAnswersFailsExactlyAtTheAttachTimeout) {  // HA-3
  Peer worker;  // accepts the attach, never answers a spawn; outlives ctl to answer its detach
  Controller ctl;
  ctl.impl().attach_timeout = 10000ms;
  ctl.impl().host_lost_after = 60000ms;  // not lost meanwhile
  auto hm = ctl.rt->attach({worker.addr()});
  ASSERT_TRUE(hm) << hm.error().to_string();
  ASSERT_TRUE((*hm)->initialized.get(10s));
  std::atomic<bool> done{false};
  std::optional<Result<std::shared_ptr<ProcMeshState>>> got;
  std::thread caller([&] {
    got = ctl.rt->spawn_procs(*hm, {0}, *ndslice::Extent::make({"gpus"}, {1}));
    done = true;
  });
  ASSERT_TRUE(eventually([&] { return worker.count("host_spawn") == 1; }));
  ctl.clock->advance(10000ms - 1ms);
  // The caller still waits; nothing but the clock can end its wait now.
  EXPECT_FALSE(done.load());
  ctl.clock->advance(1ms);
  EXPECT_TRUE(eventually([&] { return done.load(); })) << "the spawn did not time out";
  caller.join();
  ASSERT_TRUE(got && !*got);
  EXPECT_TRUE(got->error().is(MeshErrc::kSpawnFailed)) << got->error().to_string();
  EXPECT_NE(got->error().message.find("did not answer the spawn in time"), std::string::npos)
      << got->error().message;
  std::lock_guard lock(ctl.impl().mu);
  EXPECT_TRUE(ctl.impl().hosts.requests.empty());  // HA-13: given up on, forgotten
}

TEST(HostTime, DeadRecordsAreSweptExactlyAfterTheGraceUnlessStillAddressed) {  // ME-11
  Controller ctl;
  auto& impl = ctl.impl();
  auto grace = impl.dead_grace;
  channel::Address a{channel::Transport::kTcp, "127.0.0.1", 9, 7};
  channel::Address b{channel::Transport::kTcp, "127.0.0.1", 10, 8};
  // `b` is held by a handle rebuilt here (a view) until the test drops it.
  auto view = std::make_shared<ProcMeshState>();
  view->procs.resize(1);
  view->procs[0].id = actor::ProcId{b};
  ctl.rt->watch(view);
  impl.proc_gone(a.to_string(), 100, SIGKILL, -1, "was killed (test)", true);
  impl.proc_gone(b.to_string(), 101, SIGKILL, -1, "was killed (test)", true);
  ASSERT_TRUE(ctl.rt->proc_dead(a.to_string()));
  ctl.clock->advance(grace - 1ms);
  EXPECT_TRUE(ctl.rt->proc_dead(a.to_string())) << "dropped before the grace was over";
  ctl.clock->advance(1ms);
  EXPECT_FALSE(ctl.rt->proc_dead(a.to_string())) << "kept after the grace";
  // Still addressed: it waits another grace from the sweep that kept it.
  ASSERT_TRUE(ctl.rt->proc_dead(b.to_string()));
  view.reset();
  ctl.clock->advance(grace - 1ms);
  EXPECT_TRUE(ctl.rt->proc_dead(b.to_string()));
  ctl.clock->advance(1ms);
  EXPECT_FALSE(ctl.rt->proc_dead(b.to_string()));
  std::lock_guard lock(impl.mu);
  EXPECT_EQ(impl.waiting(), 0u);
}

// A HostAgent on its own proc (real clock) with a ManualClock for its heartbeats; its procs
// are `sleep` processes.
struct Worker {
  std::shared_ptr<base::ManualClock> clock = std::make_shared<base::ManualClock>();
  std::unique_ptr<actor::Proc> proc;
  std::unique_ptr<host::ChildWatcher> watcher;
  std::unique_ptr<ProcSpawner> spawner;
  OutputWriter output;
  std::unique_ptr<HostAgent> agent;

  explicit Worker(bool persistent) {
    auto p = actor::Proc::make(actor::ProcConfig{tcp_any(), {}});
    if (!p) throw std::runtime_error(p.error().to_string());
    proc = std::move(*p);
    watcher = std::make_unique<host::ChildWatcher>(proc->io());
    spawner = std::make_unique<ProcSpawner>(proc->io(), *watcher,
                                            std::vector<std::string>{"/bin/sleep", "600"},
                                            std::vector<std::string>{});
    spawner->start();
    agent = std::make_unique<HostAgent>(*proc, *spawner, output, persistent, clock);
    if (auto st = agent->start(); !st) throw std::runtime_error(st.error().to_string());
  }
  ~Worker() {
    agent->stop();
    spawner->stop();
    watcher->stop();
    proc->stop();
    output.stop();
  }
};

// Attaches `ctl` to `w` with a lost-after of 3 s and spawns one proc there; its pid.
pid_t attach_and_spawn(Peer& ctl, Worker& w) {
  auto addr = ctl.addr();
  ctl.send(w.proc->id().addr, proto::HostAttach{addr, "127.0.0.1", 1, 0, 3000}.encode());
  auto extent = *ndslice::Extent::make({"gpus"}, {1});
  ctl.send(w.proc->id().addr, proto::HostSpawn{addr, "kept", extent, 7, 1, 0, 1}.encode());
  if (!eventually([&] { return ctl.count("host_spawned") == 1; })) return -1;
  std::lock_guard lock(ctl.mu);
  for (auto& h : ctl.got) {
    if (h.op != proto::HostSpawned::kOp) continue;
    auto m = proto::HostSpawned::decode(h);
    if (!m || m->procs.size() != 1) return -1;
    return static_cast<pid_t>(m->procs[0].pid);
  }
  return -1;
}

TEST(HostTime, AWorkerDropsASilentControllerExactlyAtLostAfterAndEndsItsProcs) {  // HA-5
  Worker w(false);
  Peer ctl;
  pid_t pid = attach_and_spawn(ctl, w);
  ASSERT_GT(pid, 0);
  // The agent's tick on the new lost-after has run once it has beaten.
  ASSERT_TRUE(eventually([&] { return ctl.count("host_hb") >= 1; }));
  std::string key = ctl.addr().to_string();
  // Heard from last at the attach and the spawn (virtual time has not moved since).
  w.clock->advance(3000ms - 1ms);
  EXPECT_FALSE(w.agent->expects_undeliverable(key)) << "dropped before lost-after";
  EXPECT_TRUE(alive(pid));
  EXPECT_TRUE(eventually([&] { return ctl.count("host_hb") >= 6; })) << ctl.count("host_hb");
  w.clock->advance(1ms);
  EXPECT_TRUE(w.agent->expects_undeliverable(key)) << "still serving after lost-after";
  EXPECT_TRUE(eventually([&] { return !alive(pid); })) << "its proc was not ended";
}

TEST(HostTime, APersistentWorkerDropsASilentControllerButKeepsItsProcs) {  // HA-5, HA-7
  Worker w(true);
  Peer ctl;
  pid_t pid = attach_and_spawn(ctl, w);
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(eventually([&] { return ctl.count("host_hb") >= 1; }));
  std::string key = ctl.addr().to_string();
  w.clock->advance(3000ms);
  EXPECT_TRUE(w.agent->expects_undeliverable(key));
  // It serves the next controller, with the proc still running for it to find.
  Peer next;
  next.send(w.proc->id().addr, proto::HostAttach{next.addr(), "127.0.0.1", 1, 0, 3000}.encode());
  ASSERT_TRUE(eventually([&] { return next.count("host_attached") == 1; }));
  EXPECT_FALSE(w.agent->expects_undeliverable(next.addr().to_string()));
  EXPECT_TRUE(alive(pid));
  ::kill(pid, SIGKILL);
}

}  // namespace
}  // namespace podium::mesh
