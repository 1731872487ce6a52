// podium._core.host: the zygote's side of forking procs (cpp/podium/host/zygote.h) and the
// worker launcher (cpp/podium/host/launcher.h).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cmath>

#include "common.h"
#include "podium/host/launcher.h"
#include "podium/host/stdio_gate.h"
#include "podium/host/zygote.h"

namespace podium::python {

namespace nb = nanobind;

void bind_host(nb::module_& m) {
  // This process's own fds 1 and 2, shared with the lines its procs write (stdio_gate.h).
  m.def(
      "stdio_mark",
      [](int fd, bool open) {
        // Without letting go of the GIL as a rule: each print() marks, and a GIL handed to a
        // busy thread at each would make print() wait for it (the switch interval, 5 ms).
        auto& gate = host::StdioGate::instance();
        if (gate.try_mark(fd, open)) return;
        nb::gil_scoped_release unlocked;  // the lock is taken, or held lines are written
        gate.mark(fd, open);
      },
      nb::arg("fd"), nb::arg("open"),
      "Marks this process's fd 1 or 2 open (its content may end inside a line: procs' lines "
      "wait) or closed (held lines are written now) (SG-1).");
  m.def(
      "stdio_write_lines",
      [](int fd, const std::string& text) { host::StdioGate::instance().write_lines(fd, text); },
      nb::arg("fd"), nb::arg("text"), nb::call_guard<nb::gil_scoped_release>(),
      "Writes whole lines to this process's fd 1 or 2: now, or after the line open there "
      "closes, at most the gate's hold later (SG-1, SG-2).");
  m.def(
      "stdio_hold", [] { return host::StdioGate::instance().hold().count() / 1000.0; },
      "How long (seconds) an open line of this process holds its procs' lines (SG-2).");
  m.def(
      "zygote_serve",
      [](int fd) {
        // Forks with the GIL held and Python's own fork bookkeeping around it (at-fork
        // handlers, the random module's reseed, the threading module's reset), as os.fork
        // does. The zygote has no other Python thread, so holding the GIL while it waits
        // stalls nobody.
        host::ForkHooks hooks{[] { PyOS_BeforeFork(); }, [] { PyOS_AfterFork_Parent(); },
                              [] { PyOS_AfterFork_Child(); }};
        auto child = host::zygote_serve(fd, hooks);
        if (!child) throw_error(child.error());
        return nb::make_tuple(child->argv, child->env, child->cwd);
      },
      nb::arg("fd"),
      "Serves fork requests on `fd` until the controller closes it (then raises CoreError). "
      "Returns (argv, env, cwd) in each forked child.");

  using WorkerTuple = std::tuple<std::string, std::vector<std::string>,
                                 std::vector<std::pair<std::string, std::string>>, std::string>;
  const auto ms = [](double seconds, const char* what) {
    if (!std::isfinite(seconds) || seconds < 0) {
      throw nb::value_error((std::string(what) + " must be seconds >= 0").c_str());
    }
    return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000)));
  };
  m.def(
      "launch_workers",
      [ms](const std::string& job, const std::vector<WorkerTuple>& workers, double timeout) {
        std::vector<host::WorkerSpec> specs;
        for (const auto& [path, argv, env, log] : workers) specs.push_back({path, argv, env, log});
        const auto bound = ms(timeout, "launch_workers: timeout");
        Result<std::vector<host::LaunchedWorker>> r = std::unexpected(Error{});
        {
          nb::gil_scoped_release unlocked;
          r = host::launch_workers(job, specs, bound);
        }
        std::vector<std::tuple<int, uint64_t, std::string>> out;
        for (const auto& w : unwrap(std::move(r))) {
          out.emplace_back(w.id.pid, w.id.start_time, w.address);
        }
        return out;
      },
      nb::arg("job"), nb::arg("workers"), nb::arg("timeout"),
      "Starts each worker (path, argv, env pairs added to this environment, log) in a session "
      "of its own and waits at most `timeout` seconds for every one to write its address to "
      "PODIUM_READY_FD. Returns [(pid, start_time, address)]; on a failure every worker is "
      "ended and HostErrc.NOT_READY (or the spawn error) names the job, the worker and its "
      "log's tail (WP-1). Releases the GIL while it waits.");
  m.def(
      "stop_worker",
      [ms](int pid, std::optional<uint64_t> start_time, double grace) {
        const auto bound = ms(grace, "stop_worker: grace");
        Status s = ok();
        {
          nb::gil_scoped_release unlocked;
          s = host::stop_worker(pid, start_time, bound);
        }
        unwrap(std::move(s));
      },
      nb::arg("pid"), nb::arg("start_time").none(), nb::arg("grace"),
      "Ends worker `pid` (when it still has `start_time`) and everything in its session: "
      "SIGTERM to its group, SIGKILL to what is left after `grace` seconds; returns when none "
      "is left (WP-2, WP-3). Releases the GIL while it waits.");
  m.def(
      "worker_alive",
      [](int pid, uint64_t start_time) {
        return host::worker_alive({static_cast<pid_t>(pid), start_time});
      },
      nb::arg("pid"), nb::arg("start_time"),
      "Whether live process `pid` has `start_time` (a reused pid is not the worker).");
  m.def(
      "announce_ready", [](const std::string& address) { unwrap(host::announce_ready(address)); },
      nb::arg("address"),
      "The worker's side of the launch handshake: writes `address` to PODIUM_READY_FD and "
      "closes it (nothing when the variable is unset).");
}

}  // namespace podium::python
