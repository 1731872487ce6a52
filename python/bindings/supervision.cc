// podium._core.mesh supervision: failures of meshes that this process's root owns, queued for
// the Python thread that runs podium.actor.unhandled_fault_hook (podium._src.supervision).
//
// FaultQueue is the bindings' own hand-off from C++ threads to that Python thread: the
// Supervisor's root handler (supervision/supervisor.h) pushes on whatever C++ thread raised the
// failure and never calls Python; next_fault() pops with the GIL released. Its lock guards
// only the queue, no state of the core.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include "common.h"
#include "future.h"
#include "podium/actor/mesh_failure.h"
#include "podium/mesh/runtime.h"
#include "podium/supervision/supervisor.h"

namespace podium::python {
namespace {

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

void bind_supervision(nb::module_& m) {
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
          f = fault_queue().pop(seconds_to_ns(std::min(timeout_s, 1e6)));
        }
        if (!f) return std::nullopt;
        return failure_to_python(*f);
      },
      nb::arg("timeout_s"),
      "The next failure for the root (a dict), or None after timeout_s or interrupt_faults().");
  m.def("interrupt_faults", [] { fault_queue().interrupt(); },
        "Makes the waiting next_fault() return None at once.");
  m.def(
      "fault_raised",
      [](const std::string& actor_id) {
        nb::gil_scoped_release unlocked;
        return mesh::Runtime::get().supervisor().raised(actor_id);
      },
      nb::arg("actor_id"),
      "Whether this process's Supervisor raised a failure of that actor to its owner (SV-7).");
}

}  // namespace podium::python
