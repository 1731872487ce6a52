// podium._core.mesh: the runtime of this process, ProcMesh / ActorMesh handles, and futures
// that Python waits on or awaits.
//
// Futures. A CoreFuture wraps the C++ Future of a call's replies. wait() releases the GIL and
// waits in slices of at most 100 ms, taking the GIL between slices only to run Python's
// signal handlers (Ctrl-C) and release_deferred(). A Future never calls into Python when it
// completes: asyncio code registers a Notifier (an eventfd plus a queue of tokens); the
// completion, on whatever C++ thread sets the value, appends the token and writes the eventfd,
// and the event loop, which watches the eventfd with add_reader, drains the tokens on its own
// thread under the GIL.
//
// Ports. PortReceiver opens a port of this process's root proc whose handler (on the
// delivering C++ thread) queues each kPort or kReply message; recv() hands them out as
// CoreFutures in arrival order. send_port / send_reply send to any PortId.
//
// Mesh state. state() / from_state() turn a ProcMesh or ActorMesh handle into plain values
// (proc ids, targets, the Region) and back, so that Python can pickle meshes: a rebuilt handle
// addresses the same procs and actors; its `initialized` is resolved (the spawner owns it).
// split / flatten / rename return handles over the Region that the C++ ndslice computes.
//
// Threads: CoreFuture, Notifier, PortReceiver and the mesh handles may be used from any Python
// thread; their C++ state is thread-safe. Every function that waits, sends or spawns releases
// the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include "common.h"
#include "podium/actor/executor.h"
#include "podium/actor/message.h"
#include "podium/mesh/cast.h"
#include "podium/mesh/grace_timer.h"
#include "podium/mesh/proc_mesh.h"
#include "podium/mesh/relay.h"
#include "podium/mesh/runtime.h"
#include "podium/mesh/supervisor.h"

namespace podium::python {
namespace {

using namespace std::chrono_literals;
using Replies = mesh::Replies;

// Tokens of completed futures, for one asyncio event loop.
class Notifier {
 public:
  Notifier() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
  ~Notifier() {
    if (fd_ >= 0) ::close(fd_);
  }
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  int fileno() const { return fd_; }

  void push(uint64_t token) {
    {
      std::lock_guard lock(mu_);
      tokens_.push_back(token);
    }
    uint64_t one = 1;
    ssize_t n = ::write(fd_, &one, sizeof one);
    (void)n;  // EAGAIN: the counter is saturated, the reader is woken anyway
  }

  std::vector<uint64_t> drain() {
    uint64_t count = 0;
    ssize_t n = ::read(fd_, &count, sizeof count);
    (void)n;  // EAGAIN: nothing was written since the last drain
    std::lock_guard lock(mu_);
    return std::exchange(tokens_, {});
  }

 private:
  int fd_;
  std::mutex mu_;  // guards tokens_
  std::vector<uint64_t> tokens_;
};

// Futures of stream(): slot k resolves with the k-th reply to arrive.
struct StreamState {
  std::mutex mu;              // guards next, ranks
  size_t next = 0;
  std::vector<size_t> ranks;  // ranks[k]: the rank whose reply filled slot k
  std::vector<actor::Promise<Replies>> slots;
};

// (True, [parts]) or (False, (subsystem, code, message)).
nb::tuple reply_tuple(const mesh::Reply& rep) {
  if (rep) return nb::make_tuple(true, parts_to_python(*rep));
  return nb::make_tuple(false, error_tuple(rep.error()));
}

class CoreFuture {
 public:
  explicit CoreFuture(actor::Future<Replies> f) : f_(std::move(f)) {}
  CoreFuture(actor::Future<Replies> f, std::shared_ptr<StreamState> st, size_t slot)
      : f_(std::move(f)), stream_(std::move(st)), slot_(slot) {}

  bool ready() const { return f_.ready(); }
  const actor::Future<Replies>& future() const { return f_; }

  // True once ready; false when `timeout_s` (None: no limit) passed first.
  bool wait(std::optional<double> timeout_s) {
    release_deferred();
    if (f_.ready()) return true;
    using Clock = std::chrono::steady_clock;
    auto deadline = Clock::time_point::max();
    if (timeout_s) {
      double s = std::clamp(*timeout_s, 0.0, 1e9);
      deadline = Clock::now() + std::chrono::nanoseconds(static_cast<int64_t>(s * 1e9));
    }
    while (true) {
      auto now = Clock::now();
      if (now >= deadline) return f_.ready();
      auto slice = std::chrono::nanoseconds(100ms);
      if (deadline - now < slice) slice = deadline - now;
      {
        nb::gil_scoped_release unlocked;
        // Untimed: drive the loop (the reply is read on this thread); timed: keep the bound.
        if (timeout_s) {
          (void)f_.get(slice);
        } else {
          (void)f_.wait_slice(slice);
        }
      }
      if (f_.ready()) return true;
      if (PyErr_CheckSignals() != 0) throw nb::python_error();
      release_deferred();
    }
  }

  // Per rank: (True, [parts]) or (False, (subsystem, code, message)). Requires ready().
  nb::list replies() const { return to_python(false); }
  // The same as runs of equal replies (ME-9), in rank order: (count, ok, payload) each.
  nb::list reply_runs() const { return to_python(true); }

  // stream(): the rank (in the called region) whose reply this is. Requires ready().
  std::optional<size_t> rank() const {
    if (!stream_ || !f_.ready()) return std::nullopt;
    std::lock_guard lock(stream_->mu);
    return stream_->ranks[slot_];
  }

  void notify(const std::shared_ptr<Notifier>& n, uint64_t token) {
    f_.on_ready([n, token](const Result<Replies>&) { n->push(token); });
  }

 private:
  nb::list to_python(bool as_runs) const {
    if (!f_.ready()) throw nb::value_error("the future is not ready");
    const Result<Replies>& r = f_.get();
    if (!r) throw_error(r.error());
    nb::list out;
    for (size_t i = 0; i < r->runs(); ++i) {
      nb::tuple t = reply_tuple(r->run_value(i));
      size_t count = r->run_end(i) - r->run_begin(i);
      if (as_runs) {
        out.append(nb::make_tuple(count, t[0], t[1]));
      } else {
        for (size_t k = 0; k < count; ++k) out.append(t);
      }
    }
    return out;
  }

  actor::Future<Replies> f_;
  std::shared_ptr<StreamState> stream_;
  size_t slot_ = 0;
};

CoreFuture from_void(const actor::Future<void>& f) {
  auto p = std::make_shared<actor::Promise<Replies>>();
  CoreFuture out(p->future());
  f.on_ready([p](const Result<void>& r) {
    if (r) {
      p->set(Replies{});
    } else {
      p->set(std::unexpected(r.error()));
    }
  });
  return out;
}

std::vector<CoreFuture> stream(const ActorMeshBase& mesh, const std::string& endpoint,
                               std::vector<std::vector<Buffer>> per_rank) {
  size_t n = mesh.size();
  auto st = std::make_shared<StreamState>();
  st->ranks.resize(n);
  st->slots.resize(n);
  std::vector<CoreFuture> out;
  out.reserve(n);
  for (size_t k = 0; k < n; ++k) out.emplace_back(st->slots[k].future(), st, k);
  for (size_t r = 0; r < n; ++r) {
    auto f = mesh.call_rank_raw(r, endpoint, std::move(per_rank[r]));
    f.on_ready([st, r](const Result<Replies>& res) {
      size_t k;
      {
        std::lock_guard lock(st->mu);
        k = st->next++;
        st->ranks[k] = r;
      }
      st->slots[k].set(res);
    });
  }
  return out;
}

std::vector<std::vector<Buffer>> per_rank_buffers(nb::handle seq) {
  std::vector<std::vector<Buffer>> out;
  for (nb::handle parts : seq) out.push_back(buffers_from_python(parts));
  return out;
}

// --- ports --------------------------------------------------------------------------------

// The receiving end of a Channel: a port of this process's root proc whose handler (on the
// delivering thread, never Python) queues each message; recv() hands them out in arrival
// order as futures. A message is a kPort (parts = the value) or a kReply (an endpoint's answer
// when the port was given to send(), or a Port.send of an explicit response port).
class PortReceiver {
 public:
  struct State {
    std::mutex mu;  // guards everything below
    std::deque<mesh::Reply> items;
    std::deque<actor::Promise<Replies>> waiters;
    bool closed = false;
  };

  explicit PortReceiver(bool once) : st_(std::make_shared<State>()) {
    auto& proc = mesh::Runtime::get().proc();
    port_ = proc.open_port(
        [st = st_](wire::Envelope&& env) {
          mesh::Reply reply;
          if (env.kind == static_cast<uint8_t>(actor::MessageKind::kReply)) {
            reply = mesh::decode_reply(std::move(env)).second;
          } else {
            reply = std::move(env.parts);
          }
          deliver(*st, std::move(reply));
        },
        once);
  }
  ~PortReceiver() { close(); }
  PortReceiver(const PortReceiver&) = delete;
  PortReceiver& operator=(const PortReceiver&) = delete;

  std::string port_id() const { return port_.to_string(); }

  CoreFuture recv() {
    actor::Promise<Replies> p;
    CoreFuture out(p.future());
    std::optional<mesh::Reply> item;
    {
      std::lock_guard lock(st_->mu);
      if (!st_->items.empty()) {
        item = std::move(st_->items.front());
        st_->items.pop_front();
      } else if (st_->closed) {
        item = mesh::Reply(std::unexpected(
            make_error(actor::ActorErrc::kNoSuchPort, "the receiver of " + port_id() +
                                                          " is closed")));
      } else {
        st_->waiters.push_back(std::move(p));
        return out;
      }
    }
    p.set(Replies{std::move(*item)});
    return out;
  }

  // Closes the port; pending recv() futures fail.
  void close() {
    std::deque<actor::Promise<Replies>> waiters;
    {
      std::lock_guard lock(st_->mu);
      if (st_->closed) return;
      st_->closed = true;
      waiters.swap(st_->waiters);
    }
    mesh::Runtime::get().proc().close_port(port_.port);
    for (auto& w : waiters) {
      w.set(Replies{mesh::Reply(std::unexpected(make_error(
          actor::ActorErrc::kNoSuchPort, "the receiver of " + port_id() + " was closed")))});
    }
  }

 private:
  static void deliver(State& st, mesh::Reply reply) {
    actor::Promise<Replies> waiter;
    {
      std::lock_guard lock(st.mu);
      if (st.closed) return;
      if (st.waiters.empty()) {
        st.items.push_back(std::move(reply));
        return;
      }
      waiter = std::move(st.waiters.front());
      st.waiters.pop_front();
    }
    waiter.set(Replies{std::move(reply)});
  }

  std::shared_ptr<State> st_;
  actor::PortId port_;
};

// --- mesh state, for pickling -------------------------------------------------------------

// (proc id text, pid, host name) per base rank of the root mesh. The host is named even for
// this host (empty in ProcInfo), so that a reference unpickled on another host still names
// the host the procs run on (SV-4).
using ProcsState = std::vector<std::tuple<std::string, int, std::string>>;
// (addr, mailbox dest, actor id, proc key) per base rank; None where no actor was spawned.
using TargetState = std::optional<std::tuple<std::string, std::string, std::string, std::string>>;

ProcsState procs_state(mesh::ProcMeshState& st) {
  ProcsState out;
  std::lock_guard lock(st.mu);
  for (const auto& p : st.procs) {
    out.emplace_back(p.id.to_string(), p.pid, p.host.empty() ? actor::host_name() : p.host);
  }
  return out;
}

// A ProcMeshState for a mesh this process did not spawn: every proc registered, and
// `initialized` already resolved (the spawner owns and watches the procs).
std::shared_ptr<mesh::ProcMeshState> procs_from_state(const std::vector<std::string>& labels,
                                                      const std::vector<size_t>& sizes,
                                                      const ProcsState& procs) {
  auto st = std::make_shared<mesh::ProcMeshState>();
  st->extent = unwrap(ndslice::Extent::make(labels, sizes));
  if (procs.size() != st->extent.num_ranks()) {
    throw nb::value_error("mesh state: one proc per rank of the root extent expected");
  }
  for (const auto& [id, pid, host] : procs) {
    auto addr = unwrap(channel::Address::parse(id));
    st->procs.push_back(mesh::ProcInfo{actor::ProcId{addr}, pid, true, std::nullopt, host});
  }
  st->ready_count = st->procs.size();
  st->initialized = st->initialized_promise.future();
  st->initialized_promise.set({});
  // Calls through it to a proc that ended fail with the reason for as long as it lives
  // (runtime ME-11).
  mesh::Runtime::get().watch(st);
  return st;
}

nb::tuple proc_mesh_state(const ProcMesh& p) {
  auto& st = *p.state();
  return nb::make_tuple(st.extent.labels(), st.extent.sizes(), procs_state(st),
                        region_state(p.region()));
}

ProcMesh proc_mesh_from_state(const std::vector<std::string>& labels,
                              const std::vector<size_t>& sizes, const ProcsState& procs,
                              const RegionState& region) {
  return ProcMesh(procs_from_state(labels, sizes, procs), region_from_state(region));
}

nb::tuple actor_mesh_state(const ActorMeshBase& a) {
  const auto& st = *a.state();
  std::vector<TargetState> targets;
  for (const auto& t : st.targets) {
    if (t.dest.empty()) {
      targets.emplace_back(std::nullopt);
    } else {
      targets.emplace_back(std::make_tuple(t.addr.to_string(), t.dest, t.actor, t.proc_key));
    }
  }
  return nb::make_tuple(st.name, st.procs->extent.labels(), st.procs->extent.sizes(),
                        procs_state(*st.procs), targets, region_state(a.region()));
}

ActorMeshBase actor_mesh_from_state(const std::string& name,
                                    const std::vector<std::string>& labels,
                                    const std::vector<size_t>& sizes, const ProcsState& procs,
                                    const std::vector<TargetState>& targets,
                                    const RegionState& region) {
  auto st = std::make_shared<mesh::ActorMeshState>();
  st->name = name;
  st->procs = procs_from_state(labels, sizes, procs);
  if (targets.size() != st->procs->procs.size()) {
    throw nb::value_error("actor mesh state: one target per rank of the root extent expected");
  }
  for (size_t b = 0; b < targets.size(); ++b) {
    const auto& t = targets[b];
    mesh::ActorTarget target;
    if (t) {
      const auto& [addr, dest, actor, key] = *t;
      target.addr = unwrap(channel::Address::parse(addr));
      target.dest = dest;
      target.actor = actor;
      target.proc_key = key;
      target.host = st->procs->procs[b].host;
    }
    st->targets.push_back(std::move(target));
  }
  st->load = std::make_shared<mesh::LoadCounters>(st->targets.size());
  actor::Promise<void> init;
  st->initialized = init.future();
  init.set({});
  return ActorMeshBase(std::move(st), region_from_state(region));
}

// --- casts whose replies go to a given port (send(endpoint, ..., port=p)) ------------------

// Sends `endpoint` to every actor of the mesh's region, or to rank `only` alone (then as a
// mesh of no dimensions, like call_rank_raw), each message carrying `reply_port` as where to
// answer. Nothing here waits for the answers: they go to that port.
void cast_to_port(const ActorMeshBase& a, const std::string& endpoint,
                  std::vector<Buffer> args, const std::string& reply_port,
                  std::optional<size_t> only) {
  auto& proc = mesh::Runtime::get().proc();
  const auto& st = *a.state();
  std::vector<size_t> base = a.region().base_ranks();
  actor::CallHeader header;
  header.endpoint = endpoint;
  if (only) {
    if (*only >= base.size()) throw nb::index_error("rank out of range");
    base = {base[*only]};
  } else {
    header.labels = a.extent().labels();
    header.sizes.assign(a.extent().sizes().begin(), a.extent().sizes().end());
  }
  for (size_t r = 0; r < base.size(); ++r) {
    const mesh::ActorTarget& t = st.targets[base[r]];
    wire::Envelope env;
    env.kind = static_cast<uint8_t>(actor::MessageKind::kCall);
    env.dest = t.dest;
    if (!reply_port.empty()) env.headers.emplace_back(actor::kReplyHeader, reply_port);
    header.rank = r;
    env.parts.reserve(1 + args.size());
    env.parts.push_back(actor::encode_call_header(header));
    for (const auto& b : args) env.parts.push_back(b);
    proc.send(t.addr, std::move(env));
  }
}

// --- stop ---------------------------------------------------------------------------------

// ProcMesh.stop() after its actor meshes: stops the procs once every future in `first` is
// ready (whatever its outcome) or `wait` has passed, whichever comes first.
CoreFuture stop_after(const ProcMesh& p, const std::vector<const CoreFuture*>& first,
                      std::chrono::milliseconds wait, std::chrono::milliseconds grace) {
  struct Chain {
    std::mutex mu;  // guards started, remaining
    bool started = false;
    size_t remaining = 0;
    actor::Promise<Replies> done;
  };
  auto chain = std::make_shared<Chain>();
  CoreFuture out(chain->done.future());
  auto go = [chain, p, grace] {
    {
      std::lock_guard lock(chain->mu);
      if (chain->started) return;
      chain->started = true;
    }
    p.stop(grace).on_ready([chain](const Result<void>& r) {
      if (r) {
        chain->done.set(Replies{});
      } else {
        chain->done.set(std::unexpected(r.error()));
      }
    });
  };
  chain->remaining = first.size();
  if (first.empty()) {
    go();
    return out;
  }
  // The timer owns itself until it fires or is cancelled, once the chain is done (its wait
  // holds the ProcMesh and the chain: grace_timer.h).
  auto timer = std::make_shared<asio::steady_timer>(mesh::Runtime::get().proc().io(), wait);
  timer->async_wait([timer, go](std::error_code ec) {
    if (!ec) go();
  });
  mesh::cancel_when_ready(timer, chain->done.future());
  for (const auto* f : first) {
    f->future().on_ready([chain, go](const Result<Replies>&) {
      bool last;
      {
        std::lock_guard lock(chain->mu);
        last = --chain->remaining == 0;
      }
      if (last) go();
    });
  }
  return out;
}

// --- faults that reach this process's root -------------------------------------------------

// Failures of meshes owned by this process's root (no actor), for the Python thread that runs
// podium.actor.unhandled_fault_hook (podium._src.supervision). The Supervisor's root handler
// pushes here on whatever C++ thread raised the failure; it never calls Python.
class FaultQueue {
 public:
  void push(actor::MeshFailure f) {
    {
      std::lock_guard lock(mu_);
      q_.push_back(std::move(f));
    }
    cv_.notify_one();
  }
  // The next failure; nullopt after `timeout`, or at once after interrupt().
  std::optional<actor::MeshFailure> pop(std::chrono::nanoseconds timeout) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !q_.empty() || interrupted_; });
    if (q_.empty()) {
      interrupted_ = false;
      return std::nullopt;
    }
    auto f = std::move(q_.front());
    q_.pop_front();
    return f;
  }
  // Wakes the waiting pop() (the process is exiting).
  void interrupt() {
    {
      std::lock_guard lock(mu_);
      interrupted_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;  // guards q_, interrupted_
  std::condition_variable cv_;
  std::deque<actor::MeshFailure> q_;
  bool interrupted_ = false;
};

FaultQueue& fault_queue() {
  static auto* q = new FaultQueue();  // never destroyed: C++ threads may push until exit
  return *q;
}

}  // namespace

void bind_mesh(nb::module_& m) {
  m.def(
      "serve_faults",
      [] {
        set_unhandled_fault_handler([](actor::MeshFailure f) { fault_queue().push(std::move(f)); });
      },
      "Failures of meshes this process's root owns queue for next_fault() (instead of ending "
      "the process).");
  m.def(
      "next_fault",
      [](double timeout_s) -> std::optional<nb::dict> {
        std::optional<actor::MeshFailure> f;
        {
          nb::gil_scoped_release unlocked;
          f = fault_queue().pop(std::chrono::nanoseconds(
              static_cast<int64_t>(std::clamp(timeout_s, 0.0, 1e6) * 1e9)));
        }
        if (!f) return std::nullopt;
        return failure_to_python(*f);
      },
      nb::arg("timeout_s"),
      "The next failure for the root (a dict), or None after timeout_s or interrupt_faults().");
  m.def("interrupt_faults", [] { fault_queue().interrupt(); },
        "Makes the waiting next_fault() return None at once.");
  m.def(
      "set_poll",
      [](double runners_us, double drivers_us) {
        actor::Executor::set_poll(
            std::chrono::nanoseconds(static_cast<int64_t>(std::max(0.0, runners_us) * 1e3)),
            std::chrono::nanoseconds(static_cast<int64_t>(std::max(0.0, drivers_us) * 1e3)));
      },
      nb::arg("runners_us"), nb::arg("drivers_us"),
      "How long idle runners and waiting callers poll the reactor before they sleep (µs).");
  m.def(
      "init_controller",
      [](std::vector<std::string> proc_argv, std::vector<std::string> zygote_argv,
         std::optional<std::string> listen) {
        InitOptions options{std::move(proc_argv), std::move(zygote_argv), std::nullopt};
        if (listen) options.listen = unwrap(channel::Address::parse(*listen));
        Status st;
        {
          nb::gil_scoped_release unlocked;
          st = init_controller(std::move(options));
        }
        unwrap(st);
      },
      nb::arg("proc_argv"), nb::arg("zygote_argv") = std::vector<std::string>{},
      nb::arg("listen").none() = nb::none(),
      "Starts the controller runtime; procs are started with `proc_argv`, forked from a "
      "zygote started with `zygote_argv` when it is given. `listen`: this process's address "
      "('tcp:HOST:0' puts the job on TCP); None: a private Unix socket. A second call does "
      "nothing.");
  m.def("default_host_address", &default_host_address,
        "This machine's address as other hosts reach it (PODIUM_HOST_ADDR, else the default "
        "route's source address).");
  m.def(
      "serve_worker",
      [](const std::string& listen, std::vector<std::string> proc_argv,
         std::vector<std::string> zygote_argv, bool persistent, nb::object on_listening,
         bool insecure) {
        WorkerOptions options;
        options.insecure = insecure;
        options.listen = unwrap(parse_worker_address(listen));
        options.procs = InitOptions{std::move(proc_argv), std::move(zygote_argv), std::nullopt};
        options.persistent = persistent;
        if (!on_listening.is_none()) {
          options.on_listening = [on_listening](const channel::Address& a) {
            nb::gil_scoped_acquire locked;
            on_listening(a.to_string());
          };
        }
        Status st;
        {
          nb::gil_scoped_release unlocked;
          st = serve_worker(std::move(options));
        }
        unwrap(st);
      },
      nb::arg("listen"), nb::arg("proc_argv"), nb::arg("zygote_argv"),
      nb::arg("persistent") = false, nb::arg("on_listening").none() = nb::none(),
      nb::arg("insecure") = false,
      "Runs this process as a host agent listening on `listen` (tcp://HOST:PORT) until it is "
      "killed; `on_listening(address)` runs once it listens. Without a secret in the "
      "environment it refuses to start unless `insecure` (SE-2).");
  m.def("secret_file", [] {
        const char* p = std::getenv("PODIUM_SECRET_FILE");
        return std::string(p ? p : "");
      },
      "PODIUM_SECRET_FILE as this process's C environment holds it now: the runtime sets it "
      "when it generates the controller's secret (SE-1), which os.environ does not see.");
  m.def("is_proc", &is_proc, "True in a process that podium spawned as a proc, until it serves.");
  m.def(
      "serve_proc",
      [] {
        Status st;
        {
          nb::gil_scoped_release unlocked;
          st = serve_proc();
        }
        unwrap(st);
      },
      "Serves this proc until the controller says exit (or dies).");
  m.def(
      "shutdown",
      [] {
        nb::gil_scoped_release unlocked;
        shutdown();
      },
      "Kills every proc this process spawned and stops its runtime. Idempotent.");

  m.def(
      "send_port",
      [](const std::string& port, nb::handle parts) {
        auto bufs = buffers_from_python(parts);
        nb::gil_scoped_release unlocked;
        wire::Envelope env;
        env.kind = static_cast<uint8_t>(actor::MessageKind::kPort);
        env.dest = port;
        env.parts = std::move(bufs);
        mesh::Runtime::get().proc().send(std::move(env));
      },
      nb::arg("port"), nb::arg("parts"),
      "Sends `parts` to the port `port` (a PortId text), one-way; in order per sender.");
  m.def(
      "send_reply",
      [](const std::string& port, uint64_t rank, nb::handle parts) {
        auto bufs = buffers_from_python(parts);
        nb::gil_scoped_release unlocked;
        mesh::Runtime::get().proc().send_reply(port, rank, std::move(bufs));
      },
      nb::arg("port"), nb::arg("rank"), nb::arg("parts"),
      "Answers the call whose reply port is `port` as rank `rank` of its cast.");
  m.def("this_proc_id", [] { return mesh::Runtime::get().proc().id().to_string(); },
        "The ProcId (channel address) of this process's root proc.");
  m.def("cast_fanout", &mesh::cast_fanout,
        "Fan-out of the cast tree for casts from this process (0: always a star).");
  m.def("set_cast_fanout", &mesh::set_cast_fanout, nb::arg("k"),
        "Sets the cast tree's fan-out for casts from this process (docs/cast.md).");
  m.def(
      "traffic",
      [] {
        auto t = mesh::Runtime::get().proc().traffic();
        return std::make_pair(t.sent, t.received);
      },
      "(sent, received): envelopes this process's root proc exchanged with other procs.");

  nb::class_<PortReceiver>(m, "PortReceiver")
      .def(nb::init<bool>(), nb::arg("once"))
      .def_prop_ro("port_id", &PortReceiver::port_id)
      .def("recv", &PortReceiver::recv,
           "A future of the next message, in arrival order: one reply, (True, parts) or "
           "(False, error).")
      .def("close", &PortReceiver::close);

  nb::class_<Notifier>(m, "Notifier")
      .def(nb::new_([] { return std::make_shared<Notifier>(); }))
      .def("fileno", &Notifier::fileno)
      .def("drain", &Notifier::drain);

  nb::class_<CoreFuture>(m, "CoreFuture")
      .def("ready", &CoreFuture::ready)
      .def("wait", &CoreFuture::wait, nb::arg("timeout_s").none())
      .def("replies", &CoreFuture::replies)
      .def("reply_runs", &CoreFuture::reply_runs)
      .def("rank", &CoreFuture::rank)
      .def("notify", &CoreFuture::notify, nb::arg("notifier"), nb::arg("token"));

  nb::class_<HostMesh>(m, "HostMesh")
      .def(nb::init<>(), "This host (no dimensions).")
      .def_static(
          "attach",
          [](std::vector<std::string> workers) {
            Result<HostMesh> r = std::unexpected(Error{});
            {
              nb::gil_scoped_release unlocked;
              r = HostMesh::attach(workers);
            }
            return unwrap(std::move(r));
          },
          nb::arg("workers"),
          "The workers (tcp://HOST:PORT) as a mesh {'hosts': N}; returns at once.")
      .def_prop_ro("region", &HostMesh::region)
      .def("with_region", &HostMesh::with_region, nb::arg("region"))
      .def("initialized", [](const HostMesh& h) { return from_void(h.initialized()); })
      .def(
          "shutdown",
          [](const HostMesh& h) {
            Result<actor::Future<void>> r = std::unexpected(Error{});
            {
              nb::gil_scoped_release unlocked;
              r = h.shutdown();
            }
            return from_void(unwrap(std::move(r)));
          },
          "Ends this controller's use of these hosts: their procs are killed, as stopped.")
      .def(
          "spawn_procs",
          [](const HostMesh& h, std::vector<std::pair<std::string, size_t>> per_host,
             const std::string& name) {
            Result<ProcMesh> r = std::unexpected(Error{});
            {
              nb::gil_scoped_release unlocked;
              r = h.spawn_procs(per_host, name);
            }
            return unwrap(std::move(r));
          },
          nb::arg("per_host"), nb::arg("name") = std::string())
      .def(
          "find_procs",
          [](const HostMesh& h, const std::string& name) {
            Result<ProcMesh> r = std::unexpected(Error{});
            {
              nb::gil_scoped_release unlocked;
              r = h.find_procs(name);
            }
            return unwrap(std::move(r));
          },
          nb::arg("name"),
          "The proc mesh `name` that persistent workers kept; this process owns it now.")
      .def(
          "hosts",
          [](const HostMesh& h) {
            std::vector<std::tuple<std::string, std::string, bool, std::optional<std::string>>> out;
            if (!h.state()) return out;
            std::lock_guard lock(h.state()->mu);
            for (const auto& host : h.state()->hosts) {
              out.emplace_back(host.worker.to_string(), host.hostname, host.attached,
                               host.failure);
            }
            return out;
          },
          "Per host: (worker address, host name, attached, failure or None).");

  nb::class_<ProcMesh>(m, "ProcMesh")
      .def_static(
          "spawn_procs",
          [](std::vector<std::pair<std::string, size_t>> per_host) {
            Result<ProcMesh> r = std::unexpected(Error{});
            {
              nb::gil_scoped_release unlocked;
              r = this_host().spawn_procs(per_host);
            }
            return unwrap(std::move(r));
          },
          nb::arg("per_host"))
      .def_static("this_proc", [] { return this_proc(); })
      .def_prop_ro("region", &ProcMesh::region)
      .def_prop_ro("extent", &ProcMesh::extent)
      .def_prop_ro("size", &ProcMesh::size)
      .def("slice", [](const ProcMesh& p, std::string_view label,
                       int64_t i) { return unwrap(p.slice(label, i)); })
      .def("slice", [](const ProcMesh& p, std::string_view label,
                       const ndslice::Range& r) { return unwrap(p.slice(label, r)); })
      // The future keeps the mesh alive: `spawn_procs(...).initialized.get()` on a temporary
      // must not abandon the promise its mesh holds.
      .def("initialized", [](const ProcMesh& p) { return from_void(p.initialized()); },
           nb::keep_alive<0, 1>())
      .def(
          "spawn",
          [](const ProcMesh& p, const std::string& type, std::string name, nb::handle parts,
             std::optional<std::string> owner) {
            auto bufs = buffers_from_python(parts);
            Result<ActorMeshBase> r = std::unexpected(Error{});
            {
              nb::gil_scoped_release unlocked;
              r = p.spawn_raw(type, std::move(name), std::move(bufs), std::move(owner));
            }
            return unwrap(std::move(r));
          },
          nb::arg("type"), nb::arg("name"), nb::arg("parts"),
          nb::arg("owner").none() = std::string(),
          "Spawns; `owner` (an actor id, '' for this process's root, None for nobody) is told "
          "when an actor of the mesh fails.")
      .def(
          "adopt",
          [](const ProcMesh& p, std::string name, std::optional<std::string> owner) {
            Result<ActorMeshBase> r = std::unexpected(Error{});
            {
              nb::gil_scoped_release unlocked;
              r = p.adopt_raw(std::move(name), std::move(owner));
            }
            return unwrap(std::move(r));
          },
          nb::arg("name"), nb::arg("owner").none() = std::string(),
          "The running actors `name` of these procs, now supervised by `owner` (as in spawn).")
      .def(
          "stop",
          [](const ProcMesh& p, int64_t grace_ms) {
            nb::gil_scoped_release unlocked;
            return from_void(p.stop(std::chrono::milliseconds(grace_ms)));
          },
          nb::arg("grace_ms"))
      .def("pid", &ProcMesh::pid)
      .def("exit_status", &ProcMesh::exit_status)
      .def("state", &proc_mesh_state,
           "(root labels, root sizes, [(proc id, pid)], region state), for pickling.")
      .def_static("from_state", &proc_mesh_from_state, nb::arg("labels"), nb::arg("sizes"),
                  nb::arg("procs"), nb::arg("region"),
                  "A handle on procs that another process spawned (see state()).")
      .def("split",
           [](const ProcMesh& p, std::string_view label, std::vector<std::string> labels,
              std::vector<int64_t> sizes) {
             return ProcMesh(p.state(),
                             unwrap(p.region().split(label, std::move(labels), std::move(sizes))));
           })
      .def("flatten",
           [](const ProcMesh& p, std::string label) {
             return ProcMesh(p.state(), unwrap(p.region().flatten(std::move(label))));
           })
      .def("rename",
           [](const ProcMesh& p, std::string_view from, std::string to) {
             return ProcMesh(p.state(), unwrap(p.region().rename(from, std::move(to))));
           })
      .def(
          "stop_after",
          [](const ProcMesh& p, std::vector<const CoreFuture*> first, int64_t wait_ms,
             int64_t grace_ms) {
            nb::gil_scoped_release unlocked;
            return stop_after(p, first, std::chrono::milliseconds(wait_ms),
                              std::chrono::milliseconds(grace_ms));
          },
          nb::arg("first"), nb::arg("wait_ms"), nb::arg("grace_ms"),
          "Stops the procs once every future in `first` is ready or after wait_ms.");

  nb::class_<ActorMeshBase>(m, "ActorMesh")
      .def_prop_ro("region", &ActorMeshBase::region)
      .def_prop_ro("extent", &ActorMeshBase::extent)
      .def_prop_ro("size", &ActorMeshBase::size)
      .def_prop_ro("name", &ActorMeshBase::name)
      .def("slice", [](const ActorMeshBase& a, std::string_view label,
                       int64_t i) { return unwrap(a.slice(label, i)); })
      .def("slice", [](const ActorMeshBase& a, std::string_view label,
                       const ndslice::Range& r) { return unwrap(a.slice(label, r)); })
      .def("initialized", [](const ActorMeshBase& a) { return from_void(a.initialized()); },
           nb::keep_alive<0, 1>())
      .def(
          "call",
          [](const ActorMeshBase& a, const std::string& endpoint, nb::handle parts) {
            auto bufs = buffers_from_python(parts);
            nb::gil_scoped_release unlocked;
            return CoreFuture(a.call_raw(endpoint, std::move(bufs)));
          },
          nb::arg("endpoint"), nb::arg("parts"))
      .def(
          "call_rank",
          [](const ActorMeshBase& a, size_t rank, const std::string& endpoint,
             nb::handle parts) {
            if (rank >= a.size()) throw nb::index_error("rank out of range");
            auto bufs = buffers_from_python(parts);
            nb::gil_scoped_release unlocked;
            return CoreFuture(a.call_rank_raw(rank, endpoint, std::move(bufs)));
          },
          nb::arg("rank"), nb::arg("endpoint"), nb::arg("parts"))
      .def(
          "stream",
          [](const ActorMeshBase& a, const std::string& endpoint, nb::handle per_rank_parts) {
            auto per_rank = per_rank_buffers(per_rank_parts);
            if (per_rank.size() != a.size()) {
              throw nb::value_error("stream needs one list of parts per rank");
            }
            nb::gil_scoped_release unlocked;
            return stream(a, endpoint, std::move(per_rank));
          },
          nb::arg("endpoint"), nb::arg("per_rank_parts"),
          "Calls every rank; future k resolves with the k-th reply to arrive.")
      .def(
          "broadcast",
          [](const ActorMeshBase& a, const std::string& endpoint, nb::handle parts) {
            auto bufs = buffers_from_python(parts);
            nb::gil_scoped_release unlocked;
            a.broadcast_raw(endpoint, std::move(bufs));
          },
          nb::arg("endpoint"), nb::arg("parts"))
      .def("least_loaded_rank", &ActorMeshBase::least_loaded_rank)
      .def(
          "cast_to_port",
          [](const ActorMeshBase& a, const std::string& endpoint, nb::handle parts,
             const std::string& reply_port, std::optional<size_t> only) {
            auto bufs = buffers_from_python(parts);
            nb::gil_scoped_release unlocked;
            cast_to_port(a, endpoint, std::move(bufs), reply_port, only);
          },
          nb::arg("endpoint"), nb::arg("parts"), nb::arg("reply_port"),
          nb::arg("only").none() = nb::none(),
          "Sends to every actor of the region (or to rank `only`), answers going to "
          "`reply_port` (empty: one-way).")
      .def("state", &actor_mesh_state,
           "(name, root labels, root sizes, [(proc id, pid)], [target], region state).")
      .def_static("from_state", &actor_mesh_from_state, nb::arg("name"), nb::arg("labels"),
                  nb::arg("sizes"), nb::arg("procs"), nb::arg("targets"), nb::arg("region"),
                  "A handle on actors that another process spawned (see state()).")
      .def("split",
           [](const ActorMeshBase& a, std::string_view label, std::vector<std::string> labels,
              std::vector<int64_t> sizes) {
             return ActorMeshBase(
                 a.state(), unwrap(a.region().split(label, std::move(labels), std::move(sizes))));
           })
      .def("flatten",
           [](const ActorMeshBase& a, std::string label) {
             return ActorMeshBase(a.state(), unwrap(a.region().flatten(std::move(label))));
           })
      .def("rename",
           [](const ActorMeshBase& a, std::string_view from, std::string to) {
             return ActorMeshBase(a.state(), unwrap(a.region().rename(from, std::move(to))));
           })
      .def(
          "stop",
          [](const ActorMeshBase& a, int64_t grace_ms) {
            nb::gil_scoped_release unlocked;
            return CoreFuture(a.stop(std::chrono::milliseconds(grace_ms)));
          },
          nb::arg("grace_ms") = 10000,
          "Stops the actors; those not stopped after grace_ms have their proc killed.")
      .def(
          "rank_info",
          [](const ActorMeshBase& a, size_t rank) {
            auto b = unwrap(a.region().base_rank(rank));
            const auto& t = a.state()->targets[b];
            int pid = -1;
            {
              std::lock_guard lock(a.state()->procs->mu);
              pid = a.state()->procs->procs[b].pid;
            }
            auto point = a.state()->procs->extent.point_of_rank(b);
            // The host the actor runs on (an attached host's name as its worker gave it),
            // not this process's: SV-4.
            const std::string& host = t.host.empty() ? actor::host_name() : t.host;
            return nb::make_tuple(t.actor, pid, host, b,
                                  point ? point->to_string() : std::string());
          },
          nb::arg("rank"),
          "(actor id, pid of its proc, host, rank and coordinates in the ProcMesh) of rank "
          "`rank` of this region.");
}

}  // namespace podium::python
