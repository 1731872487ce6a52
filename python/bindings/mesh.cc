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
// Threads: CoreFuture, Notifier and the mesh handles may be used from any Python thread;
// their C++ state is thread-safe. Every function that waits or spawns releases the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "podium/mesh/proc_mesh.h"
#include "podium/mesh/runtime.h"

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

class CoreFuture {
 public:
  explicit CoreFuture(actor::Future<Replies> f) : f_(std::move(f)) {}
  CoreFuture(actor::Future<Replies> f, std::shared_ptr<StreamState> st, size_t slot)
      : f_(std::move(f)), stream_(std::move(st)), slot_(slot) {}

  bool ready() const { return f_.ready(); }

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
        (void)f_.get(slice);
      }
      if (f_.ready()) return true;
      if (PyErr_CheckSignals() != 0) throw nb::python_error();
      release_deferred();
    }
  }

  // Per rank: (True, [parts]) or (False, (subsystem, code, message)). Requires ready().
  nb::list replies() const {
    if (!f_.ready()) throw nb::value_error("the future is not ready");
    const Result<Replies>& r = f_.get();
    if (!r) throw_error(r.error());
    nb::list out;
    for (const auto& rep : *r) {
      if (rep) {
        out.append(nb::make_tuple(true, parts_to_python(*rep)));
      } else {
        out.append(nb::make_tuple(false, error_tuple(rep.error())));
      }
    }
    return out;
  }

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

}  // namespace

void bind_mesh(nb::module_& m) {
  m.def(
      "init_controller",
      [](std::vector<std::string> proc_argv) {
        Status st;
        {
          nb::gil_scoped_release unlocked;
          st = init_controller(InitOptions{std::move(proc_argv)});
        }
        unwrap(st);
      },
      nb::arg("proc_argv"),
      "Starts the controller runtime; procs are started with `proc_argv`. A second call does "
      "nothing.");
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

  nb::class_<Notifier>(m, "Notifier")
      .def(nb::new_([] { return std::make_shared<Notifier>(); }))
      .def("fileno", &Notifier::fileno)
      .def("drain", &Notifier::drain);

  nb::class_<CoreFuture>(m, "CoreFuture")
      .def("ready", &CoreFuture::ready)
      .def("wait", &CoreFuture::wait, nb::arg("timeout_s").none())
      .def("replies", &CoreFuture::replies)
      .def("rank", &CoreFuture::rank)
      .def("notify", &CoreFuture::notify, nb::arg("notifier"), nb::arg("token"));

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
      .def("initialized", [](const ProcMesh& p) { return from_void(p.initialized()); })
      .def(
          "spawn",
          [](const ProcMesh& p, const std::string& type, std::string name, nb::handle parts) {
            auto bufs = buffers_from_python(parts);
            Result<ActorMeshBase> r = std::unexpected(Error{});
            {
              nb::gil_scoped_release unlocked;
              r = p.spawn_raw(type, std::move(name), std::move(bufs));
            }
            return unwrap(std::move(r));
          },
          nb::arg("type"), nb::arg("name"), nb::arg("parts"))
      .def(
          "stop",
          [](const ProcMesh& p, int64_t grace_ms) {
            nb::gil_scoped_release unlocked;
            return from_void(p.stop(std::chrono::milliseconds(grace_ms)));
          },
          nb::arg("grace_ms"))
      .def("pid", &ProcMesh::pid)
      .def("exit_status", &ProcMesh::exit_status);

  nb::class_<ActorMeshBase>(m, "ActorMesh")
      .def_prop_ro("region", &ActorMeshBase::region)
      .def_prop_ro("extent", &ActorMeshBase::extent)
      .def_prop_ro("size", &ActorMeshBase::size)
      .def_prop_ro("name", &ActorMeshBase::name)
      .def("slice", [](const ActorMeshBase& a, std::string_view label,
                       int64_t i) { return unwrap(a.slice(label, i)); })
      .def("slice", [](const ActorMeshBase& a, std::string_view label,
                       const ndslice::Range& r) { return unwrap(a.slice(label, r)); })
      .def("initialized", [](const ActorMeshBase& a) { return from_void(a.initialized()); })
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
      .def("stop", [](const ActorMeshBase& a) {
        nb::gil_scoped_release unlocked;
        return CoreFuture(a.stop());
      });
}

}  // namespace podium::python
