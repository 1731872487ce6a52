#include "podium/actor/proc.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <signal.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "podium/actor/executor.h"
#include "podium/actor/future.h"
#include "podium/actor/message.h"
#include "podium/actor/signal.h"
#include "podium/channel/test_util.h"

namespace podium::actor {
namespace {

using namespace std::chrono_literals;
using channel::testing::eventually;

// Handlers inside "sleep" right now, across every TestActor.
std::atomic<int> g_sleeping{0};

// Replies to "echo" with its argument, to "count" with how many "note"s it saw (and checks
// they arrived in order), sleeps on "sleep", fails on "fail", never replies to "mute".
class TestActor : public ActorBase {
 public:
  explicit TestActor(std::atomic<int>* cleanups = nullptr) : cleanups_(cleanups) {}
  Status handle(wire::Envelope&& msg, Context& cx) override {
    const auto& ep = cx.call()->endpoint;
    std::string arg = msg.parts.size() > 1 ? std::string(msg.parts[1].view()) : "";
    if (ep == "echo") {
      cx.reply({Buffer::copy_of(arg)});
    } else if (ep == "note") {
      int n = std::stoi(arg);
      if (n != next_) out_of_order_ = true;
      next_ = n + 1;
    } else if (ep == "count") {
      cx.reply({Buffer::copy_of(std::to_string(out_of_order_ ? -1 : next_))});
    } else if (ep == "sleep") {
      ++g_sleeping;
      std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(arg)));  // the work
      --g_sleeping;
      cx.reply({});
    } else if (ep == "fail") {
      return std::unexpected(make_error(BaseErrc::kInternal, "asked to fail"));
    }
    return ok();
  }
  void cleanup(Context&) override {
    if (cleanups_) cleanups_->fetch_add(1);
  }

 private:
  std::atomic<int>* cleanups_;
  int next_ = 0;
  bool out_of_order_ = false;
};

std::string temp_dir() {
  auto dir = std::filesystem::temp_directory_path() /
             ("podium-proc-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all);
  return dir.string();
}

struct Reply {
  bool ok;
  std::string value;
  Error error;
};

class ProcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_dir();
    a_ = make("a");
    b_ = make("b");
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<Proc> make(const std::string& name, channel::Config cfg = {}) {
    auto addr = channel::Address::parse("unix:" + dir_ + "/" + name + ".sock");
    auto p = Proc::make(ProcConfig{*addr, cfg});
    EXPECT_TRUE(p) << p.error().to_string();
    return std::move(*p);
  }

  // Sends endpoint(arg) from `from` to `to` and returns the reply's future.
  Future<Reply> call(Proc& from, const ActorId& to, const std::string& endpoint,
                     const std::string& arg = "") {
    auto promise = std::make_shared<Promise<Reply>>();
    auto port = from.open_port(
        [promise](wire::Envelope&& env) {
          auto h = decode_reply_header(env.parts[0]);
          if (!h->ok) {
            promise->set(Reply{false, "", h->error});
          } else {
            promise->set(Reply{true, env.parts.size() > 1 ? std::string(env.parts[1].view()) : "",
                               {}});
          }
        },
        true);
    send(from, to, endpoint, arg, port.to_string());
    return promise->future();
  }

  void send(Proc& from, const ActorId& to, const std::string& endpoint, const std::string& arg,
            const std::string& reply = "") {
    wire::Envelope env;
    env.kind = static_cast<uint8_t>(MessageKind::kCall);
    env.dest = PortId{to, kMailboxPort}.to_string();
    if (!reply.empty()) env.headers.emplace_back(kReplyHeader, reply);
    env.parts.push_back(encode_call_header(CallHeader{endpoint, 0, {}, {}}));
    env.parts.push_back(Buffer::copy_of(arg));
    from.send(to.proc.addr, std::move(env));
  }

  ActorId spawn(Proc& p, const std::string& name, std::atomic<int>* cleanups = nullptr) {
    auto id = p.spawn(name, 0, [cleanups](Context&) -> Result<std::unique_ptr<ActorBase>> {
      return std::make_unique<TestActor>(cleanups);
    });
    EXPECT_TRUE(id) << id.error().to_string();
    return *id;
  }

  std::string dir_;
  std::unique_ptr<Proc> a_, b_;
};

TEST_F(ProcTest, CallAcrossProcsOverUnixSockets) {
  auto echo = spawn(*b_, "echo");
  auto r = call(*a_, echo, "echo", "hello").get(5s);
  ASSERT_TRUE(r);
  ASSERT_TRUE(r->ok) << r->error.to_string();
  EXPECT_EQ(r->value, "hello");
}

TEST_F(ProcTest, CallWithinOneProcSkipsTheChannel) {
  auto echo = spawn(*a_, "echo");
  auto r = call(*a_, echo, "echo", "local").get(5s);
  ASSERT_TRUE(r && r->ok);
  EXPECT_EQ(r->value, "local");
}

TEST_F(ProcTest, TrafficCountsEnvelopesToAndFromOtherProcsOnly) {  // AC-12
  auto echo = spawn(*b_, "echo");
  auto local = spawn(*a_, "local");
  ASSERT_TRUE(call(*a_, echo, "echo", "warm").get(5s));
  auto a0 = a_->traffic(), b0 = b_->traffic();
  constexpr uint64_t kN = 10;
  for (uint64_t i = 0; i < kN; ++i) {
    auto r = call(*a_, echo, "echo", std::to_string(i)).get(5s);
    ASSERT_TRUE(r && r->ok);
    auto l = call(*a_, local, "echo", "not counted").get(5s);  // within one proc
    ASSERT_TRUE(l && l->ok);
  }
  auto a1 = a_->traffic(), b1 = b_->traffic();
  EXPECT_EQ(a1.sent - a0.sent, kN);  // the calls
  EXPECT_EQ(a1.received - a0.received, kN);  // their replies
  EXPECT_EQ(b1.received - b0.received, kN);
  EXPECT_EQ(b1.sent - b0.sent, kN);
}

TEST_F(ProcTest, OneWayMessagesArriveInSendOrder) {  // AC-6, ME-6
  auto rec = spawn(*b_, "recorder");
  constexpr int kN = 20000;
  for (int i = 0; i < kN; ++i) send(*a_, rec, "note", std::to_string(i));
  auto r = call(*a_, rec, "count").get(20s);
  ASSERT_TRUE(r && r->ok);
  EXPECT_EQ(r->value, std::to_string(kN));
}

TEST_F(ProcTest, MessageToMissingActorComesBackWithTheReason) {  // AC-8
  ActorId ghost{b_->id(), "ghost", 0};
  auto r = call(*a_, ghost, "echo", "x").get(5s);
  ASSERT_TRUE(r);
  ASSERT_FALSE(r->ok);
  EXPECT_TRUE(r->error.is(ActorErrc::kNoSuchActor)) << r->error.to_string();
  EXPECT_NE(r->error.message.find("ghost[0]"), std::string::npos) << r->error.message;
}

TEST_F(ProcTest, ASlowHandlerDoesNotDelayOtherActors) {  // AC-7
  auto slow = spawn(*b_, "slow");
  auto fast = spawn(*b_, "fast");
  auto sleeping = call(*a_, slow, "sleep", "1500");
  ASSERT_TRUE(eventually([] { return g_sleeping > 0; }, 5s)) << "the slow call never started";
  auto t0 = std::chrono::steady_clock::now();
  auto r = call(*a_, fast, "echo", "quick").get(5s);
  auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(r && r->ok);
  EXPECT_LT(took, 1s) << "the fast actor waited behind the slow one";
  EXPECT_TRUE(sleeping.get(5s));
}

TEST_F(ProcTest, HandlerWithoutReplyAnswersWithAnError) {
  auto a = spawn(*b_, "mute");
  auto r = call(*a_, a, "mute").get(5s);
  ASSERT_TRUE(r);
  ASSERT_FALSE(r->ok);
  EXPECT_NE(r->error.message.find("without replying"), std::string::npos);
}

TEST_F(ProcTest, FailedActorRefusesLaterMessagesWithItsCause) {  // AC-8
  auto a = spawn(*b_, "fragile");
  auto r = call(*a_, a, "fail").get(5s);
  ASSERT_TRUE(r);
  ASSERT_FALSE(r->ok);
  auto later = call(*a_, a, "echo", "x").get(5s);
  ASSERT_TRUE(later);
  ASSERT_FALSE(later->ok);
  EXPECT_TRUE(later->error.is(ActorErrc::kActorFailed)) << later->error.to_string();
  EXPECT_NE(later->error.message.find("asked to fail"), std::string::npos);
}

TEST_F(ProcTest, StopDrainsQueuedMessagesThenRefuses) {  // AC-9
  std::atomic<int> cleanups{0};
  auto rec = spawn(*b_, "drained", &cleanups);
  for (int i = 0; i < 100; ++i) send(*b_, rec, "note", std::to_string(i));
  auto before = call(*b_, rec, "count");
  Promise<void> stopped;
  auto stopped_f = stopped.future();
  auto st = b_->stop_actor(rec.local_key(), [&](Status s) { stopped.set(s); });
  ASSERT_TRUE(st);
  ASSERT_TRUE(stopped_f.get(5s));
  auto r = before.get(5s);
  ASSERT_TRUE(r && r->ok);
  EXPECT_EQ(r->value, "100");
  EXPECT_EQ(cleanups.load(), 1);
  auto after = call(*a_, rec, "echo", "x").get(5s);
  ASSERT_TRUE(after);
  ASSERT_FALSE(after->ok);
  EXPECT_TRUE(after->error.is(ActorErrc::kActorStopped)) << after->error.to_string();
}

// Records the thread its cleanup runs on.
class CleanupThreadActor : public ActorBase {
 public:
  explicit CleanupThreadActor(std::atomic<std::thread::id>* on) : on_(on) {}
  Status handle(wire::Envelope&&, Context& cx) override {
    cx.reply({});
    return ok();
  }
  void cleanup(Context&) override { *on_ = std::this_thread::get_id(); }

 private:
  std::atomic<std::thread::id>* on_;
};

TEST_F(ProcTest, ADeliveryOnlyDriverLeavesStopsToARunner) {  // AC-10
  Executor::set_drivable(&b_->executor());
  std::atomic<std::thread::id> cleaned_on{};
  auto id = b_->spawn("guarded", 0, [&](Context&) -> Result<std::unique_ptr<ActorBase>> {
    return std::make_unique<CleanupThreadActor>(&cleaned_on);
  });
  ASSERT_TRUE(id);
  ASSERT_TRUE(call(*a_, *id, "echo").get(5s));  // constructed
  Promise<void> stopped;
  auto stopped_f = stopped.future();
  bool deferred = false;
  {
    // This thread drives b's loop as a Python actor's thread does between messages, until
    // it has left the stop for another thread.
    // The stop is asked for once this thread drives (the primary has stepped aside), so
    // the drain that reaches it runs here first.
    DeliveryOnlyScope scope;
    bool asked = false;
    b_->executor().drive(
        [&] {
          if (!asked && Executor::current() == &b_->executor()) {
            asked = true;
            EXPECT_TRUE(b_->stop_actor(id->local_key(), [&](Status s) { stopped.set(s); }));
          }
          return DeliveryOnlyScope::deferred();
        },
        std::chrono::steady_clock::now() + 5s);
    deferred = DeliveryOnlyScope::deferred();
  }
  b_->executor().hand_back();
  ASSERT_TRUE(stopped_f.get(5s));
  EXPECT_TRUE(deferred);
  EXPECT_NE(cleaned_on.load(), std::thread::id{});
  EXPECT_NE(cleaned_on.load(), std::this_thread::get_id());
  Executor::set_drivable(nullptr);
}

TEST_F(ProcTest, StopEndsWhatWaitsOnItsPortsWhileTheProcStillExists) {  // AC-13
  // A reply collector: the port's handler owns the promise of the reply.
  auto promise = std::make_shared<Promise<int>>();
  auto pending = promise->future();
  (void)a_->open_port([promise](wire::Envelope&&) { promise->set(1); }, true);
  promise.reset();
  a_->stop();
  // By stop()'s return, not at a_'s destruction.
  ASSERT_TRUE(pending.ready());
  auto r = pending.get(0s);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(BaseErrc::kCancelled)) << r.error().to_string();
  // A port opened later is never served: its handler goes at once.
  auto held = std::make_shared<int>(0);
  std::weak_ptr<int> watch = held;
  (void)a_->open_port([held](wire::Envelope&&) {}, true);
  held.reset();
  EXPECT_TRUE(watch.expired());
}

TEST_F(ProcTest, AMessageForAnEarlierIncarnationOfThisAddressIsRefused) {  // AC-14, CH-12
  auto listen = channel::Address::parse("tcp:127.0.0.1:0/b2");
  ASSERT_TRUE(listen);
  auto made = Proc::make(ProcConfig{*listen, {}});
  ASSERT_TRUE(made) << made.error().to_string();
  auto& now = **made;
  ASSERT_EQ(now.id().addr.incarnation, 0xb2u);
  spawn(now, "echo");
  // The same host and port under incarnation a1: a proc that has ended.
  ProcId before = now.id();
  before.addr.incarnation = 0xa1;
  auto r = call(*a_, ActorId{before, "echo", 0}, "echo", "x").get(5s);
  ASSERT_TRUE(r);
  ASSERT_FALSE(r->ok);
  EXPECT_TRUE(r->error.is(ActorErrc::kProcExited)) << r->error.to_string();
  EXPECT_NE(r->error.message.find(before.to_string() + " has ended"), std::string::npos)
      << r->error.message;
  EXPECT_NE(r->error.message.find(now.id().to_string()), std::string::npos) << r->error.message;
  // Its own address reaches the actor.
  auto ok = call(*a_, ActorId{now.id(), "echo", 0}, "echo", "y").get(5s);
  ASSERT_TRUE(ok);
  ASSERT_TRUE(ok->ok) << ok->error.to_string();
  EXPECT_EQ(ok->value, "y");
}

// AC-11: a sender numbers its calls per destination text; two spellings of one actor's
// address are two streams at the receiver too. Before, the receiver keyed them by the actor
// alone and dropped the second spelling's first calls as duplicates of the first's.
TEST_F(ProcTest, CallsToOneActorUnderTwoSpellingsOfItsAddressAllArrive) {
  auto listen = channel::Address::parse("tcp:127.0.0.1:0/c3");
  ASSERT_TRUE(listen);
  auto made = Proc::make(ProcConfig{*listen, {}});
  ASSERT_TRUE(made) << made.error().to_string();
  auto& b = **made;
  spawn(b, "echo");
  ProcId plain = b.id();
  plain.addr.incarnation = 0;  // the same listener, named without its incarnation
  for (const ProcId& to : {b.id(), plain, b.id(), plain}) {
    SCOPED_TRACE(to.to_string());
    auto r = call(*a_, ActorId{to, "echo", 0}, "echo", "y").get(5s);
    ASSERT_TRUE(r);
    ASSERT_TRUE(r->ok) << r->error.to_string();
    EXPECT_EQ(r->value, "y");
  }
}

TEST_F(ProcTest, ConstructorFailureFailsTheActor) {
  auto id = b_->spawn("broken", 0, [](Context&) -> Result<std::unique_ptr<ActorBase>> {
    return std::unexpected(make_error(BaseErrc::kInternal, "no config"));
  });
  ASSERT_TRUE(id);
  auto r = call(*a_, *id, "echo", "x").get(5s);
  ASSERT_TRUE(r);
  ASSERT_FALSE(r->ok);
  EXPECT_NE(r->error.message.find("constructor"), std::string::npos) << r->error.message;
  EXPECT_NE(r->error.message.find("no config"), std::string::npos) << r->error.message;
}

TEST_F(ProcTest, DuplicateAndReservedNamesAreRefused) {
  spawn(*b_, "one");
  auto dup = b_->spawn("one", 0, [](Context&) -> Result<std::unique_ptr<ActorBase>> {
    return std::make_unique<TestActor>();
  });
  ASSERT_FALSE(dup);
  EXPECT_TRUE(dup.error().is(ActorErrc::kDuplicateActor));
  auto reserved = b_->spawn("proc", 0, [](Context&) -> Result<std::unique_ptr<ActorBase>> {
    return std::make_unique<TestActor>();
  });
  EXPECT_FALSE(reserved);
}

TEST_F(ProcTest, UnreachableProcHandsTheCallBackAfterTheDeliveryTimeout) {  // AC-8, CH-3
  channel::Config cfg;
  cfg.delivery_timeout = 300ms;
  auto c = make("c", cfg);
  auto nowhere = channel::Address::parse("unix:" + dir_ + "/nobody.sock");
  ActorId ghost{ProcId{*nowhere}, "ghost", 0};
  auto r = call(*c, ghost, "echo", "x").get(10s);
  ASSERT_TRUE(r);
  ASSERT_FALSE(r->ok);
  EXPECT_EQ(r->error.subsystem, Subsystem::kChannel) << r->error.to_string();
}

TEST_F(ProcTest, SpawnByRegisteredTypeThroughTheSystemPort) {
  register_actor_type("TestActor", [](std::vector<Buffer>, Context&)
                                       -> Result<std::unique_ptr<ActorBase>> {
    return std::make_unique<TestActor>();
  });
  auto promise = std::make_shared<Promise<Reply>>();
  auto port = a_->open_port(
      [promise](wire::Envelope&& env) {
        auto h = decode_reply_header(env.parts[0]);
        promise->set(Reply{h->ok, "", h->error});
      },
      true);
  wire::Envelope env;
  env.kind = static_cast<uint8_t>(MessageKind::kSystem);
  env.dest = PortId{ActorId{b_->id(), "proc", 0}, kMailboxPort}.to_string();
  env.headers.emplace_back(kReplyHeader, port.to_string());
  env.parts.push_back(encode_system_header(SystemHeader{"spawn", {"TestActor", "remote"}, {5}}));
  a_->send(b_->id().addr, std::move(env));
  // A call sent right behind the spawn finds the actor (it is registered in arrival order).
  auto echoed = call(*a_, ActorId{b_->id(), "remote", 5}, "echo", "after spawn");
  auto spawned = promise->future().get(5s);
  ASSERT_TRUE(spawned && spawned->ok) << spawned->error.to_string();
  auto r = echoed.get(5s);
  ASSERT_TRUE(r && r->ok) << r->error.to_string();
  EXPECT_EQ(r->value, "after spawn");

  auto unknown = std::make_shared<Promise<Reply>>();
  auto port2 = a_->open_port(
      [unknown](wire::Envelope&& e) {
        auto h = decode_reply_header(e.parts[0]);
        unknown->set(Reply{h->ok, "", h->error});
      },
      true);
  wire::Envelope bad;
  bad.kind = static_cast<uint8_t>(MessageKind::kSystem);
  bad.dest = PortId{ActorId{b_->id(), "proc", 0}, kMailboxPort}.to_string();
  bad.headers.emplace_back(kReplyHeader, port2.to_string());
  bad.parts.push_back(encode_system_header(SystemHeader{"spawn", {"NoSuchType", "x"}, {0}}));
  a_->send(b_->id().addr, std::move(bad));
  auto u = unknown->future().get(5s);
  ASSERT_TRUE(u);
  EXPECT_FALSE(u->ok);
  EXPECT_TRUE(u->error.is(ActorErrc::kUnknownActorType)) << u->error.to_string();
}

// Spawns registered type "TestActor" as `name[index]` in `on` through its system port, with
// `supervisor` (a proc address) as the owner's process (SV-1).
void spawn_supervised(Proc& from, Proc& on, const std::string& name, uint64_t index,
                      const Proc& supervisor, uint64_t supervision_id) {
  wire::Envelope env;
  env.kind = static_cast<uint8_t>(MessageKind::kSystem);
  env.dest = PortId{ActorId{on.id(), "proc", 0}, kMailboxPort}.to_string();
  env.parts.push_back(encode_system_header(SystemHeader{
      "spawn", {"TestActor", name, supervisor.id().to_string()}, {index, supervision_id}}));
  from.send(on.id().addr, std::move(env));
}

// The "actor_failed" reports that reach a proc: (supervision id, index, MeshFailure).
struct Reports {
  std::mutex mu;
  std::vector<std::tuple<uint64_t, uint64_t, MeshFailure>> got;  // guarded by mu
  size_t wait(size_t n, std::chrono::milliseconds timeout) {
    (void)eventually(
        [&] {
          std::lock_guard lock(mu);
          return got.size() >= n;
        },
        timeout);
    std::lock_guard lock(mu);
    return got.size();
  }
};

std::shared_ptr<Reports> collect_reports(Proc& p) {
  auto reports = std::make_shared<Reports>();
  p.on_system("actor_failed", [reports](const SystemHeader& h, wire::Envelope&& env) {
    auto f = decode_mesh_failure(env.parts.at(1));
    ASSERT_TRUE(f) << f.error().to_string();
    std::lock_guard lock(reports->mu);
    reports->got.emplace_back(h.numbers.at(0), h.numbers.at(1), std::move(*f));
  });
  return reports;
}

TEST_F(ProcTest, AFailedActorReportsToItsSupervisorOnce) {  // SV-1
  register_actor_type("TestActor", [](std::vector<Buffer>, Context&)
                                       -> Result<std::unique_ptr<ActorBase>> {
    return std::make_unique<TestActor>();
  });
  auto reports = collect_reports(*a_);
  spawn_supervised(*a_, *b_, "watched", 3, *a_, 42);
  ActorId id{b_->id(), "watched", 3};
  auto r = call(*a_, id, "fail").get(5s);
  ASSERT_TRUE(r && !r->ok);
  b_->fail_actor("watched[3]", make_error(BaseErrc::kInternal, "again"));  // failed already
  (void)call(*a_, id, "echo", "x").get(5s);                               // refused
  ASSERT_EQ(reports->wait(1, 5s), 1u);
  // No sleep needed to see that no second report comes: one would have been sent before the
  // refusal's reply, on the same link, and so delivered before it (CH-1, CH-4).
  std::lock_guard lock(reports->mu);
  ASSERT_EQ(reports->got.size(), 1u);
  auto& [sid, index, f] = reports->got[0];
  EXPECT_EQ(sid, 42u);
  EXPECT_EQ(index, 3u);
  EXPECT_EQ(f.kind, MeshFailure::Kind::kActor);
  EXPECT_EQ(f.actor_id, id.to_string());
  EXPECT_EQ(f.pid, ::getpid());
  EXPECT_NE(f.cause.find("asked to fail"), std::string::npos) << f.cause;
}

TEST_F(ProcTest, FailActorAndStopOnlyTheFailureIsReported) {  // SV-1
  register_actor_type("TestActor", [](std::vector<Buffer>, Context&)
                                       -> Result<std::unique_ptr<ActorBase>> {
    return std::make_unique<TestActor>();
  });
  auto reports = collect_reports(*a_);
  spawn_supervised(*a_, *b_, "doomed", 0, *a_, 7);
  spawn_supervised(*a_, *b_, "retired", 0, *a_, 8);
  ASSERT_TRUE(call(*a_, ActorId{b_->id(), "doomed", 0}, "echo", "up").get(5s));
  ASSERT_TRUE(call(*a_, ActorId{b_->id(), "retired", 0}, "echo", "up").get(5s));
  b_->fail_actor("doomed[0]", make_error(BaseErrc::kInternal, "told to fail"));
  Signal stopped;
  ASSERT_TRUE(b_->stop_actor("retired[0]", [&](Status) { stopped.set(); }));
  ASSERT_TRUE(stopped.wait_for(5s));
  ASSERT_EQ(reports->wait(1, 5s), 1u);
  // A report of the stop would have been sent before this call's reply, on the same link
  // (CH-1, CH-4): once the reply is in, every report is.
  auto later = call(*a_, ActorId{b_->id(), "doomed", 0}, "echo", "x").get(5s);
  ASSERT_TRUE(later && !later->ok);
  EXPECT_NE(later->error.message.find("told to fail"), std::string::npos);
  std::lock_guard lock(reports->mu);
  ASSERT_EQ(reports->got.size(), 1u);  // the stop is not a failure
  EXPECT_EQ(std::get<0>(reports->got[0]), 7u);
  EXPECT_NE(std::get<2>(reports->got[0]).cause.find("told to fail"), std::string::npos);
}

TEST_F(ProcTest, AnActorWithoutSuperviseFailsOnAChildFailure) {
  auto owner = spawn(*b_, "owner");
  MeshFailure f;
  f.mesh_name = "child";
  f.actor_id = "x#child[0]";
  f.cause = "its proc (pid 1) was killed by signal SIGKILL (9)";
  wire::Envelope env;
  env.kind = static_cast<uint8_t>(MessageKind::kSupervise);
  env.dest = PortId{owner, kMailboxPort}.to_string();
  env.parts.push_back(encode_mesh_failure(f));
  a_->send(b_->id().addr, std::move(env));
  auto later = call(*a_, owner, "echo", "x").get(5s);
  ASSERT_TRUE(later && !later->ok);
  EXPECT_TRUE(later->error.is(ActorErrc::kActorFailed)) << later->error.to_string();
  EXPECT_NE(later->error.message.find("unhandled failure of a mesh it owns: actor child[0] of "
                                      "mesh 'child'"),
            std::string::npos)
      << later->error.message;
}

TEST(MeshFailureTest, EncodesAndReports) {
  MeshFailure f{MeshFailure::Kind::kProc, "counter", "unix:/x.sock#counter[1]", 1,
                "{'gpus': 1/2}", "h", 42, SIGKILL, -1, "its proc (pid 42) was killed"};
  auto back = decode_mesh_failure(encode_mesh_failure(f));
  ASSERT_TRUE(back) << back.error().to_string();
  EXPECT_EQ(back->report(), f.report());
  EXPECT_EQ(back->signal, SIGKILL);
  EXPECT_EQ(f.report(),
            "actor counter[1] of mesh 'counter' (rank 1 {'gpus': 1/2}, host h, pid 42) failed: "
            "its proc (pid 42) was killed");
  EXPECT_EQ(signal_name(SIGSEGV), "SIGSEGV");
}

}  // namespace
}  // namespace podium::actor

namespace podium::actor {
namespace {

// mesh ME-11: the AC-11 counters of ended procs are dropped; a SeqSlots cached before stays
// valid and goes on counting; a live proc's counters are kept.
TEST(ProcSeqCounters, ForgetDestsDropsTheCountersOfEndedProcsOnly) {
  auto addr = channel::Address::parse("unix:" + temp_dir() + "/seq.sock");
  auto made = Proc::make(ProcConfig{*addr, {}});
  ASSERT_TRUE(made) << made.error().to_string();
  Proc& p = **made;
  const std::string gone = "unix:/run/gone.sock", live = "unix:/run/live.sock";
  std::string d0 = gone + "#s[0]:0", d1 = gone + "#s[1]:0", d2 = live + "#s[0]:0";
  std::vector<const std::string*> dests{&d0, &d1, &d2};
  uint64_t stream = p.sender_stream();
  auto cached = p.seq_slots(stream, dests);
  std::vector<uint64_t> seqs(3);
  p.next_seqs(cached.slots, seqs.data());
  EXPECT_EQ(seqs, (std::vector<uint64_t>{1, 1, 1}));
  EXPECT_EQ(p.next_seq(stream, d2), 2u);

  std::vector<std::string> ended{gone};
  p.forget_dests(ended);
  EXPECT_EQ(p.next_seq(stream, d0), 1u);  // a fresh counter: the old one was dropped
  EXPECT_EQ(p.next_seq(stream, d2), 3u);  // kept
  p.next_seqs(cached.slots, seqs.data());  // the cached block is still there
  EXPECT_EQ(seqs, (std::vector<uint64_t>{2, 2, 4}));
}


// ---- life, pruning and virtual time ---------------------------------------------------------

// Blocks in "block" until released when it runs on the thread `helper` (else answers at once).
class BlockingActor : public ActorBase {
 public:
  BlockingActor(std::atomic<std::thread::id>* helper, std::atomic<bool>* entered,
                Signal* release)
      : helper_(helper), entered_(entered), release_(release) {}
  Status handle(wire::Envelope&&, Context& cx) override {
    if (std::this_thread::get_id() == helper_->load()) {
      entered_->store(true);
      release_->wait_for(30s);
    }
    cx.reply({});
    return ok();
  }

 private:
  std::atomic<std::thread::id>* helper_;
  std::atomic<bool>* entered_;
  Signal* release_;
};

// AC-17: a Proc destroyed while another thread helps drain one of its mailbox waits until the
// help is over (the helper touches the proc: its handler replies through it), instead of
// being freed under it.
TEST_F(ProcTest, ProcDestroyedWhileAThreadHelpsWaitsForTheHelp) {
  std::atomic<std::thread::id> helper_id{};
  std::atomic<bool> entered{false}, destroying{false}, destroyed{false};
  Signal release;
  auto id = b_->spawn("blocker", 0, [&](Context&) -> Result<std::unique_ptr<ActorBase>> {
    return std::make_unique<BlockingActor>(&helper_id, &entered, &release);
  });
  ASSERT_TRUE(id);
  ASSERT_TRUE(call(*b_, *id, "block").get(5s));  // constructed
  std::thread helper([&] {
    helper_id = std::this_thread::get_id();
    // The posted drain races this thread's help; try until the help wins (almost always
    // the first time: the runner must first wake up).
    for (int i = 0; i < 200 && !entered; ++i) {
      auto f = call(*b_, *id, "block");
      help_while_waiting();
      (void)f.get(5s);
    }
  });
  ASSERT_TRUE(eventually([&] { return entered.load(); }, 5s))
      << "the helper never ran the mailbox itself";
  std::thread destroyer([&] {
    destroying = true;
    b_.reset();
    destroyed = true;
  });
  ASSERT_TRUE(eventually([&] { return destroying.load(); }, 5s));
  // The proc must not end while the helper is inside its handler: nothing is there to wait
  // for but the absence of an end, so the destroyer gets 100 ms to (wrongly) finish.
  EXPECT_FALSE(eventually([&] { return destroyed.load(); }, 100ms))
      << "the proc was destroyed while a thread drained its mailbox";
  release.set();
  destroyer.join();
  helper.join();
  EXPECT_TRUE(destroyed);
}

// AC-18: the table of ended actors keeps the last ended_actors_kept; an older one's messages
// are refused as for an actor that never existed.
TEST_F(ProcTest, EndedActorsTableIsBounded) {
  auto addr = channel::Address::parse("unix:" + dir_ + "/bounded.sock");
  ProcConfig cfg{*addr, {}};
  cfg.ended_actors_kept = 3;
  auto p = Proc::make(cfg);
  ASSERT_TRUE(p);
  for (int i = 0; i < 5; ++i) {
    auto id = spawn(**p, "a" + std::to_string(i));
    Signal stopped;
    ASSERT_TRUE((*p)->stop_actor(id.local_key(), [&](Status) { stopped.set(); }));
    ASSERT_TRUE(stopped.wait_for(5s));
  }
  EXPECT_EQ((*p)->ended_actor_count(), 3u);
  auto recent = call(*a_, ActorId{(*p)->id(), "a4", 0}, "echo").get(5s);
  ASSERT_TRUE(recent && !recent->ok);
  EXPECT_TRUE(recent->error.is(ActorErrc::kActorStopped)) << recent->error.to_string();
  auto old = call(*a_, ActorId{(*p)->id(), "a0", 0}, "echo").get(5s);
  ASSERT_TRUE(old && !old->ok);
  EXPECT_TRUE(old->error.is(ActorErrc::kNoSuchActor)) << old->error.to_string();
  // Respawning a name keeps one entry per name.
  for (int round = 0; round < 3; ++round) {
    auto id = spawn(**p, "a4");
    Signal stopped;
    ASSERT_TRUE((*p)->stop_actor(id.local_key(), [&](Status) { stopped.set(); }));
    ASSERT_TRUE(stopped.wait_for(5s));
  }
  EXPECT_EQ((*p)->ended_actor_count(), 3u);
}

// Sends "note" calls from inside an actor (its own AC-11 stream) to `to`.
class Forwarder : public ActorBase {
 public:
  Forwarder(ActorId to, int n) : to_(std::move(to)), n_(n) {}
  Status handle(wire::Envelope&&, Context& cx) override {
    wire::Envelope env;
    env.kind = static_cast<uint8_t>(MessageKind::kCall);
    env.dest = PortId{to_, kMailboxPort}.to_string();
    env.parts.push_back(encode_call_header(CallHeader{"note", 0, {}, {}}));
    env.parts.push_back(Buffer::copy_of(std::to_string(n_)));
    cx.proc().send(to_.proc.addr, std::move(env));
    cx.reply({});
    return ok();
  }

 private:
  ActorId to_;
  int n_;
};

// AC-16: an actor's sending stream goes when it stops, and a respawned actor of the same
// name starts a new one (its calls are not taken for duplicates of the old ones); the
// receiver drops the streams of a sender process it is told has ended.
TEST_F(ProcTest, OrderingStateIsPrunedWhenSendersEnd) {
  auto rec = spawn(*b_, "recorder");
  auto fwd = [&](int n) {
    auto id = a_->spawn("fwd", 0, [&, n](Context&) -> Result<std::unique_ptr<ActorBase>> {
      return std::make_unique<Forwarder>(rec, n);
    });
    EXPECT_TRUE(id);
    return *id;
  };
  auto before = a_->ordering_state().sending_streams;
  for (int round = 0; round < 3; ++round) {
    auto id = fwd(round);
    ASSERT_TRUE(call(*a_, id, "go").get(5s));
    EXPECT_EQ(a_->ordering_state().sending_streams, before + 2) << "the actor's and the test's";
    Signal stopped;
    ASSERT_TRUE(a_->stop_actor(id.local_key(), [&](Status) { stopped.set(); }));
    ASSERT_TRUE(stopped.wait_for(5s));
    EXPECT_EQ(a_->ordering_state().sending_streams, before + 1);
    // Each incarnation's "note" reached the recorder: none was dropped as a duplicate.
    auto r = call(*a_, rec, "count").get(5s);
    ASSERT_TRUE(r && r->ok);
    EXPECT_EQ(r->value, std::to_string(round + 1)) << "round " << round;
  }
  EXPECT_GE(b_->ordering_state().receiving_streams, 2u);
  std::string a_key = a_->id().to_string();
  b_->forget_dests(std::span<const std::string>(&a_key, 1));
  EXPECT_EQ(b_->ordering_state().receiving_streams, 0u);
}

// AC-11 through a Proc on virtual time: a call held behind a missing one is delivered once
// the ManualClock passes kOrderGapTimeout, with no wall-clock wait.
TEST_F(ProcTest, OrderGapSkippedAfterTimeoutOnManualClock) {
  auto clock = std::make_shared<base::ManualClock>();
  auto addr = channel::Address::parse("unix:" + dir_ + "/virtual.sock");
  ProcConfig cfg{*addr, {}};
  cfg.clock = clock;
  auto p = Proc::make(cfg);
  ASSERT_TRUE(p);
  auto echo = spawn(**p, "echo");
  ASSERT_TRUE(call(**p, echo, "echo", "up").get(5s));
  auto promise = std::make_shared<Promise<Reply>>();
  auto port = (*p)->open_port(
      [promise](wire::Envelope&& env) {
        auto h = decode_reply_header(env.parts[0]);
        promise->set(Reply{h->ok, std::string(env.parts.size() > 1 ? env.parts[1].view() : ""),
                           h->error});
      },
      true);
  wire::Envelope env;
  env.kind = static_cast<uint8_t>(MessageKind::kCall);
  env.dest = PortId{echo, kMailboxPort}.to_string();
  env.headers.emplace_back(kReplyHeader, port.to_string());
  env.parts.push_back(encode_call_header(CallHeader{"echo", 0, {}, {}}));
  env.parts.push_back(Buffer::copy_of("late"));
  env.order_stream = 99;
  env.order_seq = 2;  // number 1 never comes
  (*p)->send(std::move(env));
  auto f = promise->future();
  EXPECT_FALSE(f.get(20ms)) << "delivered before its gap was skipped";
  clock->advance(kOrderGapTimeout - 1s);
  EXPECT_FALSE(f.get(20ms));
  clock->advance(1s);
  auto r = f.get(5s);
  ASSERT_TRUE(r && r->ok);
  EXPECT_EQ(r->value, "late");
}

}  // namespace
}  // namespace podium::actor
