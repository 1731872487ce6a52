// End-to-end tests of the C++ mesh API: real procs spawned from this binary.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "podium/mesh/actor_mesh.h"

namespace {

using namespace std::chrono_literals;

class Worker : public podium::Actor {
 public:
  explicit Worker(int base) : base_(base) {
    if (base < 0) throw std::runtime_error("negative base");
  }
  int add(int x) { return base_ + x + static_cast<int>(rank()) * 100; }
  int pid() { return ::getpid(); }
  void note(int i) {
    if (i != next_) out_of_order_ = true;
    next_ = i + 1;
  }
  int notes() { return out_of_order_ ? -1 : next_; }
  std::string boom(std::string why) { throw std::runtime_error(why); }
  void exit_now(int code) { ::_exit(code); }
  int slow(int ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return ms;
  }
  PODIUM_ENDPOINTS(Worker, add, pid, note, notes, boom, exit_now, slow)

 private:
  int base_;
  int next_ = 0;
  bool out_of_order_ = false;
};
PODIUM_ACTOR(Worker, int)

// Takes `ms` to construct: its spawn message is delivered (and acknowledged) at once, but
// answered only then.
class SlowStarter : public podium::Actor {
 public:
  explicit SlowStarter(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
  int ping() { return 1; }
  PODIUM_ENDPOINTS(SlowStarter, ping)
};
PODIUM_ACTOR(SlowStarter, int)

// Failures that reach this controller's root (the default would end the test binary).
std::mutex g_faults_mu;
std::vector<podium::actor::MeshFailure> g_faults;  // guarded by g_faults_mu

size_t fault_count() {
  std::lock_guard lock(g_faults_mu);
  return g_faults.size();
}

// The failures recorded from index `from` on, once there are `n` of them (or after 5 s).
std::vector<podium::actor::MeshFailure> faults_since(size_t from, size_t n) {
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard lock(g_faults_mu);
      if (g_faults.size() >= from + n) break;
    }
    std::this_thread::sleep_for(5ms);
  }
  std::lock_guard lock(g_faults_mu);
  return {g_faults.begin() + static_cast<long>(std::min(from, g_faults.size())), g_faults.end()};
}

template <class T>
T ok(podium::Result<T> r) {
  EXPECT_TRUE(r) << r.error().to_string();
  if (!r) throw std::runtime_error(r.error().to_string());
  return std::move(*r);
}

class MeshTest : public ::testing::Test {
 protected:
  void SetUp() override {
    procs_.emplace(ok(podium::this_host().spawn_procs({{"procs", 4}})));
    workers_.emplace(ok(procs_->spawn<Worker>("worker", 10)));
    auto init = workers_->initialized().get(10s);
    ASSERT_TRUE(init) << init.error().to_string();
  }
  void TearDown() override {
    if (procs_) {
      EXPECT_TRUE(procs_->stop(2000ms).get(10s));
    }
  }
  std::optional<podium::ProcMesh> procs_;
  std::optional<podium::ActorMesh<Worker>> workers_;
};

TEST_F(MeshTest, CallReturnsOneValuePerRankInOrder) {
  auto v = ok(workers_->call(&Worker::add, 1).get(10s));
  ASSERT_EQ(v.size(), 4u);
  for (size_t r = 0; r < 4; ++r) EXPECT_EQ(v[r], 11 + 100 * static_cast<int>(r));
  auto items = v.items();
  EXPECT_EQ(items[2].first.to_string(), "{'procs': 2/4}");
  auto pids = ok(workers_->call(&Worker::pid).get(10s));
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_EQ(pids[r], procs_->pid(r));
    EXPECT_NE(pids[r], ::getpid());
  }
}

TEST_F(MeshTest, SlicesReachExactlyTheirRanks) {
  auto odd = ok(workers_->slice("procs", podium::ndslice::Range{1, std::nullopt, 2}));
  auto v = ok(odd.call(&Worker::add, 0).get(10s));
  ASSERT_EQ(v.size(), 2u);
  // Ranks are those of the slice (0, 1), the actors those of procs 1 and 3.
  EXPECT_EQ(v[0], 10);
  EXPECT_EQ(v[1], 110);
  auto pids = ok(odd.call(&Worker::pid).get(10s));
  EXPECT_EQ(pids[0], procs_->pid(1));
  EXPECT_EQ(pids[1], procs_->pid(3));
  auto one = ok(workers_->slice("procs", 3));
  EXPECT_EQ(ok(one.call_one(&Worker::pid).get(10s)), procs_->pid(3));
  EXPECT_FALSE(workers_->slice("nope", 0));
  EXPECT_FALSE(workers_->slice("procs", 4));
}

TEST_F(MeshTest, CallOneOnSeveralActorsFailsAtOnce) {
  auto r = workers_->call_one(&Worker::pid).get(1s);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("exactly one"), std::string::npos);
}

TEST_F(MeshTest, BroadcastThenCallKeepsSenderOrder) {  // ME-6
  for (int i = 0; i < 2000; ++i) ASSERT_TRUE(workers_->broadcast(&Worker::note, i));
  auto v = ok(workers_->call(&Worker::notes).get(20s));
  for (int n : v.values()) EXPECT_EQ(n, 2000);
}

TEST_F(MeshTest, ChooseSpreadsOverIdleActors) {
  // Two slow calls occupy two actors; choose() picks one of the others.
  auto a = workers_->slice("procs", 0);
  auto b = workers_->slice("procs", 1);
  auto s0 = ok(std::move(a)).call_one(&Worker::slow, 300);
  auto s1 = ok(std::move(b)).call_one(&Worker::slow, 300);
  auto chosen = ok(workers_->choose(&Worker::pid).get(10s));
  EXPECT_TRUE(chosen == procs_->pid(2) || chosen == procs_->pid(3));
  EXPECT_TRUE(s0.get(10s));
  EXPECT_TRUE(s1.get(10s));
}

TEST_F(MeshTest, EndpointExceptionIsReportedAndTheActorLivesOn) {
  auto r = workers_->call(&Worker::boom, std::string("kaboom")).get(10s);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("kaboom"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("rank 0"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("worker[0]"), std::string::npos) << r.error().message;
  EXPECT_TRUE(workers_->call(&Worker::add, 0).get(10s));
}

TEST_F(MeshTest, KilledProcFailsPendingCallsAtOnce) {  // ME-2
  auto victim = ok(workers_->slice("procs", 1));
  auto pending = victim.call_one(&Worker::slow, 10000);
  std::this_thread::sleep_for(50ms);
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(procs_->pid(1), SIGKILL), 0);
  auto r = pending.get(5s);
  auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("SIGKILL"), std::string::npos) << r.error().message;
  EXPECT_LT(took, 1s);
  std::printf("[ measured ] SIGKILL to failed call: %.1f ms\n",
              std::chrono::duration<double, std::milli>(took).count());
  // Later calls on that rank fail at once; the other ranks keep working.
  auto later = victim.call_one(&Worker::pid).get(1s);
  ASSERT_FALSE(later);
  auto others = ok(workers_->slice("procs", podium::ndslice::Range{2, 4, 1}));
  EXPECT_TRUE(others.call(&Worker::pid).get(10s));
  EXPECT_NE(procs_->exit_status(1).value_or("").find("SIGKILL"), std::string::npos);
}

TEST_F(MeshTest, KilledProcRaisesOneFaultToTheOwner) {  // SV-2, SV-3
  size_t before = fault_count();
  int pid = procs_->pid(3);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  auto faults = faults_since(before, 1);
  std::this_thread::sleep_for(100ms);  // a second event would arrive by now
  faults = faults_since(before, 1);
  ASSERT_EQ(faults.size(), 1u);
  const auto& f = faults[0];
  EXPECT_EQ(f.kind, podium::actor::MeshFailure::Kind::kProc);
  EXPECT_EQ(f.mesh_name, "worker");
  EXPECT_EQ(f.rank, 3u);
  EXPECT_EQ(f.pid, pid);
  EXPECT_EQ(podium::actor::signal_name(f.signal), "SIGKILL");
  EXPECT_NE(f.report().find("worker[3] of mesh 'worker' (rank 3 {'procs': 3/4}"),
            std::string::npos)
      << f.report();
}

TEST_F(MeshTest, StopIsNotAFault) {  // SV-2
  size_t before = fault_count();
  EXPECT_TRUE(workers_->stop().get(10s));
  EXPECT_TRUE(procs_->stop(2000ms).get(10s));
  procs_.reset();
  // No wait needed: stop() resolves once every proc's end was seen, and the runtime hands
  // an end to the supervisor before it tells the waiters (proc_table.cc, proc_gone), so a
  // fault, had there been one, is counted already.
  EXPECT_EQ(fault_count(), before);
}

TEST_F(MeshTest, ProcExitCodeIsReported) {
  auto victim = ok(workers_->slice("procs", 2));
  auto r = victim.call_one(&Worker::exit_now, 3).get(5s);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("exited with status 3"), std::string::npos)
      << r.error().message;
}

// ME-5: a constructor's failure fails the actor mesh's initialized with its cause.
TEST(MeshSpawn, ConstructorExceptionFailsInitialized) {
  auto procs = ok(podium::this_host().spawn_procs({{"procs", 2}}));
  auto bad = ok(procs.spawn<Worker>("bad", -1));
  auto init = bad.initialized().get(10s);
  ASSERT_FALSE(init);
  EXPECT_NE(init.error().message.find("negative base"), std::string::npos) << init.error().message;
  auto call = bad.call(&Worker::pid).get(5s);
  EXPECT_FALSE(call);
  EXPECT_TRUE(procs.stop(2000ms).get(10s));
}

TEST(MeshSpawn, ActorsInTheCallersOwnProc) {
  auto here = podium::this_proc();
  auto local = ok(here.spawn<Worker>("local", 5));
  ASSERT_TRUE(local.initialized().get(5s));
  EXPECT_EQ(ok(local.call_one(&Worker::pid).get(5s)), ::getpid());
  EXPECT_EQ(ok(local.call_one(&Worker::add, 1).get(5s)), 6);
}

// ME-3: every proc of a stopped mesh has been reaped.
TEST(MeshSpawn, StopEndsEveryProc) {
  auto procs = ok(podium::this_host().spawn_procs({{"hosts", 2}, {"gpus", 2}}));
  ASSERT_TRUE(procs.initialized().get(10s));
  EXPECT_EQ(procs.extent().to_string(), "{'hosts': 2, 'gpus': 2}");
  ASSERT_TRUE(procs.stop(2000ms).get(10s));
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_TRUE(procs.exit_status(r).has_value());
    EXPECT_NE(::kill(procs.pid(r), 0), 0);  // reaped and gone
  }
}

// CH-11: a controller that spawns and stops meshes again and again keeps no link to the procs
// that ended (each held a queue, timers and buffers: ~9 KB a proc, for the life of the
// controller).
TEST(MeshSpawn, StoppedProcsLeaveNoLinkBehind) {
  auto& proc = podium::mesh::Runtime::get().proc();
  // Links to the procs of earlier tests may still be dropped meanwhile: the count may only
  // fall below this, never rise above it.
  size_t before = proc.link_count();
  for (int round = 0; round < 3; ++round) {
    auto procs = ok(podium::this_host().spawn_procs({{"procs", 3}}));
    auto workers = ok(procs.spawn<Worker>("linked", 1));
    ASSERT_TRUE(workers.initialized().get(10s));
    ASSERT_TRUE(workers.call(&Worker::add, 1).get(10s));
    EXPECT_GE(proc.link_count(), 3u);
    ASSERT_TRUE(procs.stop(2000ms).get(10s));
    // The exits are seen asynchronously (pidfd or zygote report), so wait for them, bounded.
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (proc.link_count() > before && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
    EXPECT_LE(proc.link_count(), before) << "round " << round;
  }
}

// True while `pid` exists and is not a zombie (a dead proc reparented to an init that has
// not reaped it yet counts as gone).
bool running(int pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return false;
  char state = '?';
  int n = std::fscanf(f, "%*d (%*[^)]) %c", &state);
  std::fclose(f);
  return n == 1 && state != 'Z' && state != 'X';
}

TEST(MeshSpawn, ProcsDieWithTheirController) {
  // A controller (this binary, run as one) spawns procs, reports their pids and is SIGKILLed:
  // no proc may outlive it by more than 5 s.
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  pid_t controller = ::fork();
  ASSERT_GE(controller, 0);
  if (controller == 0) {
    ::dup2(out[1], 1);
    ::close(out[0]);
    const char* self = "/proc/self/exe";
    ::execl(self, self, "--orphan-controller", nullptr);
    ::_exit(127);
  }
  ::close(out[1]);
  std::string text;
  char buf[256];
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (text.find("ready") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  std::vector<int> pids;
  for (size_t pos = 0; (pos = text.find("pid ", pos)) != std::string::npos; pos += 4) {
    pids.push_back(std::atoi(text.c_str() + pos + 4));
  }
  ::kill(controller, SIGKILL);
  ::waitpid(controller, nullptr, 0);
  ASSERT_EQ(pids.size(), 2u) << text;
  auto t0 = std::chrono::steady_clock::now();
  for (int pid : pids) {
    while (running(pid) && std::chrono::steady_clock::now() - t0 < 5s) {
      std::this_thread::sleep_for(5ms);
    }
    EXPECT_FALSE(running(pid)) << "proc " << pid << " outlived its controller";
  }
  std::printf("[ measured ] procs gone %.1f ms after their controller's SIGKILL\n",
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count());
}

// A controller whose proc fails with nobody to handle it: the default root handler logs the
// report and ends the controller with status 1.
int unhandled_fault_controller() {
  auto procs = podium::this_host().spawn_procs({{"procs", 2}});
  if (!procs) return 2;
  auto workers = procs->spawn<Worker>("worker", 1);
  if (!workers || !workers->initialized().get(10s)) return 2;
  auto one = workers->slice("procs", 1);
  if (!one) return 2;
  one->broadcast(&Worker::exit_now, 3);
  std::this_thread::sleep_for(20s);  // the handler ends the program first
  std::printf("still running\n");
  return 0;
}

// Runs this binary again as a controller in `mode` (a flag main() knows) and captures what
// it and its procs print until all of them are gone (each mode ends itself; ctest's timeout
// bounds the test). `status` is waitpid's, or -1 if the run could not be made.
struct ControllerRun {
  int status = -1;
  std::string text;
};

ControllerRun run_controller(const char* mode) {
  ControllerRun run;
  int out[2];
  if (::pipe(out) != 0) return run;
  pid_t controller = ::fork();
  if (controller == 0) {
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::close(out[0]);
    const char* self = "/proc/self/exe";
    ::execl(self, self, mode, nullptr);
    ::_exit(127);
  }
  ::close(out[1]);
  char buf[512];
  while (true) {  // until the controller (and the procs that share the pipe) are gone
    ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n <= 0) break;
    run.text.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  if (::waitpid(controller, &status, 0) == controller) run.status = status;
  return run;
}

// Whether the run was made and its controller exited (not killed by a signal) with `code`.
::testing::AssertionResult exited_with(const ControllerRun& run, int code) {
  if (run.status == -1) return ::testing::AssertionFailure() << "the run could not be made";
  if (!WIFEXITED(run.status)) {
    return ::testing::AssertionFailure() << "wait status " << run.status << ", not an exit";
  }
  if (WEXITSTATUS(run.status) != code) {
    return ::testing::AssertionFailure() << "exit status " << WEXITSTATUS(run.status)
                                         << ", expected " << code;
  }
  return ::testing::AssertionSuccess();
}

TEST(MeshSupervision, AnUnhandledFaultEndsTheControllerWithStatus1) {  // SV-3, BT-2
  auto run = run_controller("--unhandled-fault");
  const std::string& text = run.text;
  ASSERT_TRUE(exited_with(run, 1)) << text;
  EXPECT_EQ(text.find("still running"), std::string::npos) << text;
  EXPECT_NE(text.find("unhandled failure: actor worker[1] of mesh 'worker' (rank 1 "
                      "{'procs': 1/2}, host "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("exited with status 3"), std::string::npos) << text;
}

int orphan_controller() {
  auto procs = podium::this_host().spawn_procs({{"procs", 2}});
  if (!procs || !procs->initialized().get(10s)) return 1;
  for (size_t r = 0; r < 2; ++r) std::printf("pid %d\n", procs->pid(r));
  std::printf("ready\n");
  std::fflush(stdout);
  std::this_thread::sleep_for(60s);  // until the test kills us
  return 0;
}

// ME-10: two threads call shutdown() at once (a program's main thread on its way to exit()
// while another thread ends the process for a failure). Neither may return before the
// runtime has stopped: the last thing shutdown() does is remove the socket directory, so
// each checks that it is gone once its call returns. Prints "early" if one returned sooner.
int concurrent_shutdown_controller() {
  auto procs = podium::this_host().spawn_procs({{"procs", 4}});
  if (!procs || !procs->initialized().get(10s)) return 2;
  // unix:<dir>/<name>.sock: this controller's own listening socket, in the directory.
  std::string self = podium::mesh::Runtime::get().proc().id().to_string();
  if (self.rfind("unix:", 0) != 0) return 2;
  std::filesystem::path dir = std::filesystem::path(self.substr(5)).parent_path();
  if (!std::filesystem::exists(dir)) return 2;
  std::atomic<int> early{0};
  auto stop = [&] {
    podium::shutdown();
    if (std::filesystem::exists(dir)) early.fetch_add(1);
  };
  std::thread a(stop), b(stop);
  a.join();
  b.join();
  std::printf("%s\n", early.load() ? "early" : "both returned after the runtime stopped");
  return early.load() ? 1 : 0;
}

TEST(MeshShutdown, ConcurrentCallsBothReturnAfterTheRuntimeStopped) {  // ME-10
  auto run = run_controller("--concurrent-shutdown");
  const std::string& text = run.text;
  ASSERT_TRUE(exited_with(run, 0)) << text;
  EXPECT_NE(text.find("both returned after the runtime stopped"), std::string::npos) << text;
}

// AC-13: the runtime shuts down while an actor's constructor still runs, its spawn message
// delivered and acknowledged. The mesh's `initialized` future fails as the proc stops its
// ports, inside shutdown(); it once crashed the controller instead, completing from a
// destructor at exit.
int abandoned_spawn_controller() {
  auto procs = podium::this_host().spawn_procs({{"procs", 1}});
  if (!procs || !procs->initialized().get(10s)) return 2;
  auto slow = procs->spawn<SlowStarter>("slow", 60000);
  if (!slow) return 2;
  auto init = slow->initialized();
  std::this_thread::sleep_for(300ms);  // delivered and acknowledged (CH-10: within 1 ms)
  podium::shutdown();
  if (!init.ready()) {
    std::printf("initialized still pending after shutdown()\n");
    return 1;
  }
  auto r = init.get(0s);
  std::printf("initialized: %s\n", r ? "ok" : r.error().to_string().c_str());
  return 0;
}

TEST(MeshShutdown, ActorsThatNeverAnsweredTheirSpawnFailWithTheShutdown) {  // AC-13
  auto run = run_controller("--abandoned-spawn");
  const std::string& text = run.text;
  ASSERT_TRUE(exited_with(run, 0)) << text;
  // Either the ports' stop ("the actors of mesh 'slow' had not all started when this process
  // shut down") or, when the proc's death reaches the mesh first, the death watch ("actor
  // slow[0] of mesh 'slow' ...: its proc ... was killed by signal SIGKILL (9) when this process
  // shut down") fails it: both name the mesh and the shutdown.
  size_t at = text.find("initialized: ");
  ASSERT_NE(at, std::string::npos) << text;
  std::string line = text.substr(at, text.find('\n', at) - at);
  EXPECT_EQ(line.find("initialized: ok"), std::string::npos) << text;
  EXPECT_NE(line.find("mesh 'slow'"), std::string::npos) << text;
  EXPECT_NE(line.find("when this process shut down"), std::string::npos) << text;
}

}  // namespace

int main(int argc, char** argv) {
  podium::init(argc, argv);  // spawned procs serve here and never return
  if (argc == 2 && std::string(argv[1]) == "--orphan-controller") return orphan_controller();
  if (argc == 2 && std::string(argv[1]) == "--unhandled-fault") return unhandled_fault_controller();
  if (argc == 2 && std::string(argv[1]) == "--abandoned-spawn") return abandoned_spawn_controller();
  if (argc == 2 && std::string(argv[1]) == "--concurrent-shutdown") {
    return concurrent_shutdown_controller();
  }
  podium::set_unhandled_fault_handler([](podium::actor::MeshFailure f) {
    std::lock_guard lock(g_faults_mu);
    g_faults.push_back(std::move(f));
  });
  ::testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  podium::shutdown();
  return rc;
}
