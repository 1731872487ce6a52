// podium._core.actor: Python actors on the C++ actor runtime.
//
// The actor type "python" is a C++ ActorBase (PythonActor) whose handler never runs Python:
// it moves each call into the actor's Inbox and returns, taking over the reply duty
// (Context::take_reply). A Python-owned thread per actor pops the Inbox (GIL released while it
// waits), runs the endpoint and answers with Inbox.reply (GIL released while it sends). So
// runner and I/O threads never take the GIL, one actor runs one message at a time in arrival
// order (the Inbox is FIFO and has one consumer), and actors of one process run in parallel
// as far as the GIL lets them; a thread blocked in a Future wait holds no GIL and stalls
// nobody.
//
// Construction. The spawn of a "python" actor runs the TypeFactory on a runner (AC-6: as the
// first item of its mailbox). The factory queues a SpawnRequest for the process's spawner (a
// Python thread that podium._src.server starts) and waits, as a blocking runner (the
// executor adds another, AC-2), until the new actor thread has run __init__: so the spawn's
// reply, and the mesh's `initialized`, follow the constructor, and a constructor that raises
// fails the spawn with the remote traceback.
//
// Failure. Python calls Inbox.fail() when an endpoint raises a BaseException or an exception
// nobody awaits (broadcast), or when __supervise__ does not handle a failure. The actor thread
// answers what is already queued with that error, and the runtime fails the actor at once
// (Proc::fail_actor: later messages are refused with the cause, and the failure is reported
// to the owner of the actor's mesh, SV-1).
//
// Supervision. A failure of a mesh that the actor owns (a kSupervise message) is queued apart
// from the calls, ahead of them (SV-6: kind "supervise", popped first): a sync actor runs
// __supervise__ after the call in progress and before the queued ones, an async actor as a
// task of its loop (the eventfd wakes it while an endpoint awaits), and a sync owner waiting
// for a child's result pops it alone (next(..., supervise_only=True)).
//
// Stop. PythonActor::cleanup queues a stop item after the queued calls and waits until the
// actor thread ran __cleanup__ and acknowledged (or exited).
//
// Async actors. An actor with `async def` endpoints waits in its asyncio loop, not in pop():
// Inbox.event_fd() is an eventfd that every push and close() writes; the loop watches it with
// add_reader and pops with a zero timeout, so @concurrent_endpoint calls keep running between
// messages.
//
// Threads: Inbox and SpawnQueue members are thread-safe. Python-facing functions need the GIL
// and release it around every wait and send.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "podium/actor/actor.h"
#include "podium/actor/proc.h"
#include "podium/actor/executor.h"
#include "podium/actor/signal.h"
#include "podium/channel/net.h"

namespace podium::python {
namespace {

using namespace std::chrono_literals;

struct InboxItem {
  enum class Kind : uint8_t { kCall, kStop, kSupervise };
  Kind kind = Kind::kCall;
  std::string endpoint;
  uint64_t rank = 0;
  std::vector<std::string> labels;
  std::vector<uint64_t> sizes;
  std::string reply_port;                  // empty: one-way
  std::vector<Buffer> parts;               // the call's arguments (after the CallHeader)
  std::shared_ptr<actor::Signal> stopped;  // kStop: set once __cleanup__ has run
  actor::MeshFailure failure;              // kSupervise
};

// The queue between a PythonActor (producer: runner threads, one at a time by AC-6) and its
// Python thread (the one consumer).
class Inbox {
 public:
  Inbox(actor::Proc& proc, std::string actor_id, std::string name, uint32_t index)
      : proc_(proc), actor_id_(std::move(actor_id)), name_(std::move(name)), index_(index) {}

  actor::Proc& proc() { return proc_; }
  const std::string& actor_id() const { return actor_id_; }
  const std::string& name() const { return name_; }
  uint32_t index() const { return index_; }

  ~Inbox() {
    int fd = efd_.load();
    if (fd >= 0) ::close(fd);
  }

  void push(InboxItem item) {
    bool wake;
    bool driver_elsewhere;
    {
      std::lock_guard lock(mu_);
      // SV-6: supervision goes ahead of the ordered calls, in a queue of its own.
      (item.kind == InboxItem::Kind::kSupervise ? sq_ : q_).push_back(std::move(item));
      wake = sleeping_;
      driver_elsewhere = driving_ && driver_ != std::this_thread::get_id();
    }
    if (wake) cv_.notify_one();
    if (driver_elsewhere) wake_driver();
    signal_event();
  }

  // An eventfd that every push (and close) writes, for consumers that wait in an asyncio
  // loop instead of in pop(). Created on the first call; the consumer drains it.
  int event_fd() {
    std::lock_guard lock(mu_);
    int fd = efd_.load();
    if (fd < 0) {
      fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
      if (fd < 0) return -1;
      efd_.store(fd);
    }
    return fd;
  }
  void drain_event() {
    int fd = efd_.load();
    if (fd < 0) return;
    uint64_t count = 0;
    ssize_t n = ::read(fd, &count, sizeof count);
    (void)n;  // EAGAIN: nothing written since the last drain
  }

  // Waits up to `timeout` for an item; nullopt on timeout or once closed and empty.
  //
  // With driving on (procs: set_driving), the waiting thread runs the proc's loop itself
  // while it waits (Executor::drive): it reads the next call from the socket and routes it
  // into this inbox, so a call reaches the actor's thread with no hand-off from a runner.
  // When another thread drives, it sleeps on cv_ until an item comes or that thread
  // releases the loop (Executor::on_release wakes one waiter per release). It runs
  // deliveries only (DeliveryOnlyScope, AC-10): a construct or a stop waits for other
  // threads (an actor's stop for that actor's thread, maybe this one), so when a drain
  // leaves one behind, this thread hands the loop back and waits on cv_ for the rest of
  // this call while a runner runs it.
  //
  // Supervision items come first (SV-6); `supervise_only` waits for one of them only, leaving
  // calls and stops queued (a sync owner waiting for the supervision of a child's failure).
  std::optional<InboxItem> pop(std::chrono::nanoseconds timeout, bool supervise_only = false) {
    auto ready_locked = [&] {
      return !sq_.empty() || (!supervise_only && !q_.empty()) || closed_;
    };
    auto deadline = std::chrono::steady_clock::now() + timeout;
    actor::Executor* ex = g_driving.load(std::memory_order_relaxed) &&
                                  timeout > std::chrono::nanoseconds::zero()
                              ? actor::Executor::drivable()
                              : nullptr;
    std::unique_lock lock(mu_);
    while (!ready_locked() && std::chrono::steady_clock::now() < deadline) {
      if (!ex) {
        wait_locked(lock, deadline);
        continue;
      }
      driving_ = true;
      driver_ = std::this_thread::get_id();
      lock.unlock();
      bool deferred;
      {
        actor::DeliveryOnlyScope deliveries_only;
        ex->drive(
            [this, &ready_locked] {
              if (actor::DeliveryOnlyScope::deferred()) return true;
              std::lock_guard l(mu_);
              return ready_locked();
            },
            deadline);
        deferred = actor::DeliveryOnlyScope::deferred();
      }
      if (deferred) ex->hand_back();
      lock.lock();
      driving_ = false;
      if (deferred) {
        ex = nullptr;  // a runner runs what was left; this call only waits now
        continue;
      }
      if (ready_locked()) break;
      // Another thread drives (or the deadline passed): sleep until an item or a release.
      released_ = false;
      lock.unlock();
      uint64_t token = ex->on_release([this] {
        {
          std::lock_guard l(mu_);
          released_ = true;
        }
        cv_.notify_all();
      });
      lock.lock();
      if (token == 0) continue;  // the loop is free: take it
      while (!released_ && !ready_locked() && std::chrono::steady_clock::now() < deadline) {
        wait_locked(lock, deadline);
      }
      lock.unlock();
      ex->cancel_release(token);
      lock.lock();
    }
    std::deque<InboxItem>& from = !sq_.empty() ? sq_ : q_;
    if (from.empty() || (supervise_only && &from == &q_)) return std::nullopt;
    InboxItem item = std::move(from.front());
    from.pop_front();
    return item;
  }

  // Calls (not stops) are waiting to be popped.
  bool calls_queued() {
    std::lock_guard lock(mu_);
    for (const auto& it : q_) {
      if (it.kind == InboxItem::Kind::kCall) return true;
    }
    return false;
  }

  void close() {
    bool driver_elsewhere;
    {
      std::lock_guard lock(mu_);
      closed_ = true;
      driver_elsewhere = driving_ && driver_ != std::this_thread::get_id();
    }
    cv_.notify_all();
    if (driver_elsewhere) wake_driver();
    signal_event();
  }

  // Whether actor threads drive the loop while they wait (on in procs, off in controllers,
  // whose main thread drives while it waits for replies).
  static void set_driving(bool on) { g_driving.store(on); }
  bool closed() {
    std::lock_guard lock(mu_);
    return closed_ && q_.empty() && sq_.empty();
  }

  void fail(Error e) {
    {
      std::lock_guard lock(mu_);
      if (failure_) return;
      failure_ = e;
    }
    proc_.fail_actor(name_ + "[" + std::to_string(index_) + "]", std::move(e));
  }
  std::optional<Error> failure() {
    std::lock_guard lock(mu_);
    return failure_;
  }

  // The Python thread has left its loop: nobody will pop again.
  void set_finished() {
    finished_.set();
    std::deque<InboxItem> left;
    {
      std::lock_guard lock(mu_);
      left.swap(q_);
      sq_.clear();  // failures of meshes this actor owned: it is gone, nobody handles them
    }
    for (auto& it : left) {
      if (it.stopped) it.stopped->set();
      if (!it.reply_port.empty()) {
        proc_.send_reply(it.reply_port, it.rank,
                         std::unexpected(make_error(actor::ActorErrc::kActorStopped,
                                                    actor_id_ + ": actor thread has exited")));
      }
    }
  }
  bool finished() const { return finished_.is_set(); }

 private:
  actor::Proc& proc_;
  const std::string actor_id_;
  const std::string name_;
  const uint32_t index_;
  std::mutex mu_;  // guards q_, sq_, closed_, failure_, sleeping_
  std::condition_variable cv_;
  std::deque<InboxItem> q_;
  std::deque<InboxItem> sq_;  // kSupervise items, popped before q_ (SV-6)
  bool sleeping_ = false;  // the consumer waits on cv_ (push skips the notify otherwise)
  bool closed_ = false;
  std::optional<Error> failure_;
  actor::Signal finished_;
  std::atomic<int> efd_{-1};  // written once (under mu_), then read by any thread
  bool driving_ = false;      // guarded by mu_: the consumer runs the loop (Executor::drive)
  bool released_ = false;     // guarded by mu_: on_release() woke the waiting consumer
  std::thread::id driver_;    // guarded by mu_: the consumer's thread, while driving_
  static inline std::atomic<bool> g_driving{false};

  // A push from a thread other than the driving consumer: end its run_one() (a posted
  // no-op), so that it sees the item.
  void wake_driver() { asio::post(proc_.io(), [] {}); }

  // Requires mu_. Sleeps on cv_ until notified or `deadline` (push notifies while sleeping_).
  void wait_locked(std::unique_lock<std::mutex>& lock,
                   std::chrono::steady_clock::time_point deadline) {
    sleeping_ = true;
    cv_.wait_until(lock, deadline);
    sleeping_ = false;
  }

  void signal_event() {
    int fd = efd_.load();
    if (fd < 0) return;
    uint64_t one = 1;
    ssize_t n = ::write(fd, &one, sizeof one);
    (void)n;  // EAGAIN: the counter is saturated, the reader is woken anyway
  }
};

class PythonActor : public actor::ActorBase {
 public:
  explicit PythonActor(std::shared_ptr<Inbox> inbox) : inbox_(std::move(inbox)) {}
  ~PythonActor() override { inbox_->close(); }

  Status handle(wire::Envelope&& msg, actor::Context& cx) override {
    if (auto f = inbox_->failure()) return std::unexpected(std::move(*f));
    const actor::CallHeader* call = cx.call();
    if (msg.kind != static_cast<uint8_t>(actor::MessageKind::kCall) || !call) {
      cx.reply_error(make_error(actor::ActorErrc::kBadArguments,
                                inbox_->actor_id() + ": a Python actor takes only calls"));
      return ok();
    }
    InboxItem item;
    item.endpoint = call->endpoint;
    item.rank = call->rank;
    item.labels = call->labels;
    item.sizes = call->sizes;
    item.reply_port = cx.take_reply();
    item.parts.assign(std::make_move_iterator(msg.parts.begin() + 1),
                      std::make_move_iterator(msg.parts.end()));
    inbox_->push(std::move(item));
    return ok();
  }

  Status supervise(const actor::MeshFailure& failure, actor::Context&) override {
    InboxItem item;
    item.kind = InboxItem::Kind::kSupervise;
    item.failure = failure;
    inbox_->push(std::move(item));
    return ok();  // the actor thread decides; it fails the actor if not handled
  }

  void cleanup(actor::Context&) override {
    auto stopped = std::make_shared<actor::Signal>();
    InboxItem item;
    item.kind = InboxItem::Kind::kStop;
    item.stopped = stopped;
    inbox_->push(std::move(item));
    // __cleanup__ is user code: wait as long as it runs, but not for a thread that is gone.
    while (!stopped->wait_for(100ms)) {
      if (inbox_->finished()) break;
    }
    inbox_->close();
  }

 private:
  std::shared_ptr<Inbox> inbox_;
};

struct SpawnRequest {
  std::shared_ptr<Inbox> inbox;
  std::vector<Buffer> args;
  actor::Signal done;
  std::optional<Error> error;  // written before done.set()

  void finish(std::optional<Error> e) {
    if (done.is_set()) return;
    error = std::move(e);
    done.set();
  }
};

// Spawn requests from factories (runner threads) to the process's Python spawner thread.
class SpawnQueue {
 public:
  bool push(std::shared_ptr<SpawnRequest> r) {
    {
      std::lock_guard lock(mu_);
      if (!serving_) return false;
      q_.push_back(std::move(r));
    }
    cv_.notify_one();
    return true;
  }
  std::shared_ptr<SpawnRequest> pop(std::chrono::nanoseconds timeout) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !q_.empty() || !serving_; });
    if (q_.empty()) return nullptr;
    auto r = std::move(q_.front());
    q_.pop_front();
    return r;
  }
  void serve() {
    std::lock_guard lock(mu_);
    serving_ = true;
  }
  void close() {
    std::deque<std::shared_ptr<SpawnRequest>> left;
    {
      std::lock_guard lock(mu_);
      serving_ = false;
      left.swap(q_);
    }
    cv_.notify_all();
    for (auto& r : left) {
      r->finish(make_error(actor::ActorErrc::kProcStopped,
                           "the Python actor runtime of this process has shut down"));
    }
  }
  bool serving() {
    std::lock_guard lock(mu_);
    return serving_;
  }

 private:
  std::mutex mu_;  // guards q_, serving_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<SpawnRequest>> q_;
  bool serving_ = false;
};

SpawnQueue& spawn_queue() {
  static auto* q = new SpawnQueue();  // never destroyed: runner threads may outlive statics
  return *q;
}

Result<std::unique_ptr<actor::ActorBase>> make_python_actor(std::vector<Buffer> args,
                                                            actor::Context& cx) {
  auto req = std::make_shared<SpawnRequest>();
  req->inbox = std::make_shared<Inbox>(cx.proc(), cx.self().to_string(), cx.self().name,
                                       cx.self().index);
  req->args = std::move(args);
  if (!spawn_queue().push(req)) {
    return std::unexpected(make_error(actor::ActorErrc::kUnknownActorType,
                                      "this process does not serve Python actors (yet)"));
  }
  // The spawner thread and the actor thread always finish the request (or close() does).
  while (!req->done.wait_for(100ms)) {
    if (!spawn_queue().serving() && !req->done.is_set()) {
      req->finish(make_error(actor::ActorErrc::kProcStopped,
                             "the Python actor runtime of this process has shut down"));
    }
  }
  if (req->error) return std::unexpected(*req->error);
  return std::make_unique<PythonActor>(req->inbox);
}

// What Python sees of an InboxItem.
struct PyItem {
  InboxItem item;
};

}  // namespace

nb::dict failure_to_python(const actor::MeshFailure& f) {
  nb::dict d;
  d["kind"] = f.kind == actor::MeshFailure::Kind::kProc ? "proc" : "actor";
  d["mesh_name"] = f.mesh_name;
  d["actor_id"] = f.actor_id;
  d["rank"] = f.rank;
  d["point"] = f.point;
  d["host"] = f.host;
  d["pid"] = f.pid;
  d["signal"] = f.signal != 0 ? nb::cast(actor::signal_name(f.signal)) : nb::none();
  d["exit_code"] = f.exit_code >= 0 ? nb::cast(f.exit_code) : nb::none();
  d["cause"] = f.cause;
  d["report"] = f.report();
  return d;
}

void bind_actor(nb::module_& m) {
  m.def("serve_python_actors",
        [] {
          spawn_queue().serve();
          actor::register_actor_type("python", &make_python_actor);
        },
        "Registers the actor type 'python' and lets spawn requests queue for this process's "
        "spawner thread (next_spawn).");
  m.def("set_driving", &Inbox::set_driving, nb::arg("on"),
        "Whether actor threads run the proc's loop while they wait for their next message.");
  m.def("close_spawns", [] { spawn_queue().close(); },
        "Fails queued and later spawns of Python actors; next_spawn returns None.");
  m.def(
      "next_spawn",
      [](std::optional<double> timeout_s) -> std::shared_ptr<SpawnRequest> {
        release_deferred();
        nb::gil_scoped_release unlocked;
        return spawn_queue().pop(seconds_to_ns(timeout_s.value_or(kForeverS)));
      },
      nb::arg("timeout_s").none() = nb::none(),
      "The next spawn request, or None after timeout_s (None: no timeout) or close_spawns().");

  nb::class_<SpawnRequest>(m, "SpawnRequest")
      .def_prop_ro("inbox", [](SpawnRequest& r) { return r.inbox; })
      .def_prop_ro("parts", [](SpawnRequest& r) { return parts_to_python(r.args); })
      .def("constructed", [](SpawnRequest& r) { r.finish(std::nullopt); },
           "__init__ has run: the spawn succeeds.")
      .def("failed",
           [](SpawnRequest& r, std::string message) {
             r.finish(make_error(actor::ActorErrc::kActorFailed, std::move(message)));
           },
           "__init__ raised: the spawn fails with `message`.");

  nb::class_<PyItem>(m, "InboxItem")
      .def_prop_ro("kind",
                   [](const PyItem& p) {
                     switch (p.item.kind) {
                       case InboxItem::Kind::kStop: return "stop";
                       case InboxItem::Kind::kSupervise: return "supervise";
                       case InboxItem::Kind::kCall: break;
                     }
                     return "call";
                   })
      .def_prop_ro("failure", [](const PyItem& p) { return failure_to_python(p.item.failure); })
      .def_prop_ro("endpoint", [](const PyItem& p) { return p.item.endpoint; })
      .def_prop_ro("rank", [](const PyItem& p) { return p.item.rank; })
      .def_prop_ro("labels", [](const PyItem& p) { return p.item.labels; })
      .def_prop_ro("sizes", [](const PyItem& p) { return p.item.sizes; })
      .def_prop_ro("reply_port", [](const PyItem& p) { return p.item.reply_port; })
      .def_prop_ro("parts", [](const PyItem& p) { return parts_to_python(p.item.parts); })
      .def("fields",
           [](PyItem& p) {
             InboxItem& it = p.item;
             // The parts move to Python, so that a part this call alone received is writable
             // there (BU-1); `parts` is empty afterwards.
             std::vector<Buffer> parts = std::move(it.parts);
             it.parts.clear();
             return nb::make_tuple(it.endpoint, it.rank, it.reply_port, it.labels, it.sizes,
                                   parts_to_python(parts));
           },
           "(endpoint, rank, reply_port, labels, sizes, parts) of a call, in one step; the "
           "parts move out of the item.")
      .def("stopped", [](PyItem& p) {
        if (p.item.stopped) p.item.stopped->set();
      });

  nb::class_<Inbox>(m, "Inbox")
      .def_prop_ro("actor_id", &Inbox::actor_id)
      .def_prop_ro("name", &Inbox::name)
      .def_prop_ro("index", &Inbox::index)
      .def(
          "next",
          [](Inbox& in, std::optional<double> timeout_s,
             bool supervise_only) -> std::optional<PyItem> {
            release_deferred();
            std::optional<InboxItem> item;
            {
              nb::gil_scoped_release unlocked;
              item = in.pop(seconds_to_ns(timeout_s.value_or(kForeverS)), supervise_only);
            }
            if (!item) return std::nullopt;
            return PyItem{std::move(*item)};
          },
          nb::arg("timeout_s").none() = nb::none(), nb::arg("supervise_only") = false,
          "The next item (supervision items first), or None after timeout_s or once closed "
          "(timeout_s None: only once closed; close() wakes the wait). supervise_only: the "
          "next supervision item only; calls and stops stay queued.")
      .def_prop_ro("closed", &Inbox::closed)
      .def("close", &Inbox::close)
      .def(
          "reply",
          [](Inbox& in, const std::string& port, uint64_t rank, nb::handle parts) {
            auto bufs = buffers_from_python(parts);
            nb::gil_scoped_release unlocked;
            if (!in.calls_queued()) {
              in.proc().send_reply(port, rank, std::move(bufs));
              return;
            }
            // More calls are queued: this reply may ride with the next write (channel
            // CH-7, at most flush_later_delay later). The bound is a timer on the loop, so
            // the loop must be run meanwhile: give it back to the runner if it is parked.
            if (actor::Executor* ex = actor::Executor::drivable()) ex->hand_back();
            channel::FlushLater later;
            in.proc().send_reply(port, rank, std::move(bufs));
          },
          nb::arg("port"), nb::arg("rank"), nb::arg("parts"),
          "Answers a call. When more calls are queued, the reply may wait up to the "
          "channel's flush_later_delay (50 µs) to share a write with the next ones.")
      .def(
          "reply_error",
          [](Inbox& in, const std::string& port, uint64_t rank, std::string message) {
            nb::gil_scoped_release unlocked;
            in.proc().send_reply(
                port, rank,
                std::unexpected(make_error(actor::ActorErrc::kHandlerFailed, std::move(message))));
          },
          nb::arg("port"), nb::arg("rank"), nb::arg("message"))
      .def(
          "reply_stopped",
          [](Inbox& in, const std::string& port, uint64_t rank, std::string message) {
            nb::gil_scoped_release unlocked;
            in.proc().send_reply(
                port, rank,
                std::unexpected(make_error(actor::ActorErrc::kActorStopped,
                                           in.actor_id() + ": " + std::move(message))));
          },
          nb::arg("port"), nb::arg("rank"), nb::arg("message"),
          "Answers a call that the actor's stop cancelled.")
      .def("event_fd", &Inbox::event_fd,
           "An eventfd written on every push and on close (asyncio actors watch it).")
      .def("drain_event", &Inbox::drain_event)
      .def(
          "reply_failure",
          [](Inbox& in, const std::string& port, uint64_t rank) {
            auto f = in.failure();
            if (!f) return;
            nb::gil_scoped_release unlocked;
            in.proc().send_reply(port, rank, std::unexpected(*f));
          },
          "Answers with the error that failed this actor.")
      .def(
          "fail",
          [](Inbox& in, std::string message) {
            auto e = make_error(actor::ActorErrc::kActorFailed,
                                in.actor_id() + " failed: " + std::move(message));
            nb::gil_scoped_release unlocked;
            in.fail(std::move(e));
          },
          "Fails the actor: queued calls and later ones are refused with `message`, and the "
          "owner of its mesh is told.")
      .def_prop_ro("failed", [](Inbox& in) { return in.failure().has_value(); })
      .def("finished", [](Inbox& in) {
        nb::gil_scoped_release unlocked;
        in.set_finished();
      });
}

}  // namespace podium::python
