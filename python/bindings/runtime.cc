// podium._core.mesh runtime functions: starting this process as a controller, a host agent
// (worker) or a proc, its shutdown, and the knobs and counters of its runtime
// (mesh/runtime.h, mesh/relay.h). Each forwards to the C++ function of the same name.
//
// Threads: any Python thread; every function that starts, serves or stops releases the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <asio/io_context.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "future.h"
#include "podium/actor/executor.h"
#include "podium/actor/proc.h"
#include "podium/channel/http.h"
#include "podium/channel/probe.h"
#include "podium/mesh/proc_mesh.h"
#include "podium/mesh/relay.h"
#include "podium/mesh/runtime.h"

namespace podium::python {

namespace {

// DS-4, HT-1..HT-3: the dashboard's HTTP responder (channel/http.h) on this process's root
// proc's io_context. Requests queue here; a Python thread takes them with next() (the GIL
// released while it waits) and answers with respond(): Python never runs on an io thread.
class HttpServer {
 public:
  explicit HttpServer(const std::string& addr) : state_(std::make_shared<State>()) {
    auto a = unwrap(channel::Address::parse(addr));
    auto st = state_;
    Result<std::shared_ptr<channel::HttpResponder>> made;
    {
      nb::gil_scoped_release unlocked;
      made = channel::HttpResponder::listen(
          mesh::Runtime::get().proc().io(), a,
          [st](std::string path, channel::HttpResponder::Respond respond) {
            std::lock_guard lock(st->mu);
            if (st->stopped) return;  // the connection closes with the responder
            uint64_t id = ++st->last_id;
            st->answers.emplace(id, std::move(respond));
            st->requests.emplace_back(id, std::move(path));
            st->cv.notify_one();
          });
    }
    http_ = unwrap(std::move(made));
  }

  std::string address() const { return http_->bound().to_string(); }

  // The next request (id, path), or None after `timeout_s` or once stopped.
  std::optional<std::pair<uint64_t, std::string>> next(double timeout_s) {
    nb::gil_scoped_release unlocked;
    std::unique_lock lock(state_->mu);
    state_->cv.wait_for(lock, std::chrono::duration<double>(timeout_s),
                        [&] { return state_->stopped || !state_->requests.empty(); });
    if (state_->stopped || state_->requests.empty()) return std::nullopt;
    auto r = std::move(state_->requests.front());
    state_->requests.pop_front();
    return r;
  }

  void respond(uint64_t id, int status, const std::string& content_type, nb::bytes body) {
    std::string b(body.c_str(), body.size());
    channel::HttpResponder::Respond respond;
    {
      std::lock_guard lock(state_->mu);
      auto it = state_->answers.find(id);
      if (it == state_->answers.end()) return;
      respond = std::move(it->second);
      state_->answers.erase(it);
    }
    respond(status, content_type, std::move(b));
  }

  bool stopped() const {
    std::lock_guard lock(state_->mu);
    return state_->stopped;
  }

  void stop() {
    {
      std::lock_guard lock(state_->mu);
      state_->stopped = true;
      state_->requests.clear();
      state_->answers.clear();
      state_->cv.notify_all();
    }
    nb::gil_scoped_release unlocked;
    http_->stop();
  }

 private:
  struct State {
    mutable std::mutex mu;  // guards everything below
    std::condition_variable cv;
    bool stopped = false;
    uint64_t last_id = 0;
    std::deque<std::pair<uint64_t, std::string>> requests;
    std::map<uint64_t, channel::HttpResponder::Respond> answers;
  };
  std::shared_ptr<State> state_;
  std::shared_ptr<channel::HttpResponder> http_;
};

}  // namespace

void bind_runtime(nb::module_& m) {
  nb::class_<HttpServer>(m, "HttpServer",
                         "DS-4: a loopback-only HTTP GET responder in C++ (channel/http.h, "
                         "HT-1..HT-3) on this process's io threads; a Python thread takes its "
                         "requests with next() and answers them with respond().")
      .def(nb::init<const std::string&>(), nb::arg("addr"),
           "Listens on `addr` ('tcp:127.0.0.1:PORT'; a loopback address only).")
      .def_prop_ro("address", &HttpServer::address, "The bound address.")
      .def("next", &HttpServer::next, nb::arg("timeout_s"),
           "(request id, path with its query), or None after timeout_s or once stopped.")
      .def("respond", &HttpServer::respond, nb::arg("id"), nb::arg("status"),
           nb::arg("content_type"), nb::arg("body"), "Answers request `id` (once).")
      .def_prop_ro("stopped", &HttpServer::stopped)
      .def("stop", &HttpServer::stop, "Closes the listener and every connection.");
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
         std::optional<std::string> listen, std::optional<std::string> via) {
        InitOptions options{std::move(proc_argv), std::move(zygote_argv), std::nullopt};
        if (listen) options.listen = unwrap(channel::Address::parse(*listen));
        if (via) {
          auto where = channel::parse_worker_address(*via);  // CH-24
          if (!where) throw_error(make_error(BaseErrc::kInvalidArgument, where.error().message));
          if (where->dial.transport != channel::Transport::kTcp) {
            throw_error(make_error(BaseErrc::kInvalidArgument,
                                   "attach(" + *via + "): a gateway is a worker's "
                                   "tcp://HOST:PORT"));
          }
          options.via = where->dial;
        }
        Status st;
        {
          nb::gil_scoped_release unlocked;
          st = init_controller(std::move(options));
        }
        unwrap(st);
      },
      nb::arg("proc_argv"), nb::arg("zygote_argv") = std::vector<std::string>{},
      nb::arg("listen").none() = nb::none(), nb::arg("via").none() = nb::none(),
      "Starts the controller runtime; procs are started with `proc_argv`, forked from a "
      "zygote started with `zygote_argv` when it is given. `listen`: this process's address "
      "('tcp:HOST:0' puts the job on TCP); None: a private Unix socket. `via`: a worker's "
      "address ('tcp://HOST:PORT') to attach this client through (its gateway; then `listen` "
      "is unused and this process listens nowhere). A second call does nothing.");
  m.def("default_host_address", &default_host_address,
        "This machine's address as other hosts reach it (PODIUM_HOST_ADDR, else the default "
        "route's source address).");
  m.def(
      "serve_worker",
      [](const std::string& listen, std::vector<std::string> proc_argv,
         std::vector<std::string> zygote_argv, bool persistent, nb::object on_listening,
         bool insecure, bool until_shutdown) {
        WorkerOptions options;
        options.insecure = insecure;
        options.until_shutdown = until_shutdown;
        auto where = channel::parse_worker_address(listen);  // CH-24
        if (!where) throw_error(make_error(BaseErrc::kInvalidArgument, where.error().message));
        options.listen = where->bind;
        if (where->alias) options.advertise = where->dial;
        options.listen_fd = where->fd;
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
      nb::arg("insecure") = false, nb::arg("until_shutdown") = false,
      "Runs this process as a host agent listening on `listen` (tcp://HOST:PORT, ipc://PATH, "
      "tcp://HOST:fdN or DIAL@BIND) until it is killed (with `until_shutdown`: until a "
      "controller shuts this host down, then returns); `on_listening(address)` runs once it "
      "listens. Without a secret in the environment it refuses to start unless `insecure` "
      "(SE-2).");
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
      "max_frame_bytes", [] { return mesh::Runtime::get().proc().max_frame_bytes(); },
      "The largest frame this process's channel sends or accepts: a call's arguments must fit "
      "in one, with its header.");
  m.def("this_proc_id", [] { return mesh::Runtime::get().proc().id().to_string(); },
        "The ProcId (channel address) of this process's root proc.");
  m.def(
      "channel_stats",
      [] {
        auto s = mesh::Runtime::get().proc().channel_stats();
        nb::dict d;
        d["refused_oversize"] = s.refused_oversize;
        d["refused_malformed"] = s.refused_malformed;
        d["refused_auth"] = s.refused_auth;
        d["handshake_timeouts"] = s.handshake_timeouts;
        d["unauthenticated_cap_hits"] = s.unauthenticated_cap_hits;
        d["setup_errors"] = s.setup_errors;
        d["lent_parts"] = s.lent_parts;
        d["pulls"] = s.pulls;
        d["pull_failures"] = s.pull_failures;
        d["shared_copied"] = s.shared_copied;
        d["shared_blocks_made"] = s.shared_blocks_made;
        d["shared_mapped"] = s.shared_mapped;
        d["shared_map_failed"] = s.shared_map_failed;
        return d;
      },
      "This process's root proc's channel counters (CH-15), its parts lent to peers and not "
      "yet acknowledged (CH-26), this process's pulls of lent parts (CH-25) and its parts "
      "sent and received in shared blocks (CH-29).");
  m.def(
      "serve_gateway",
      [](const std::string& addr) {
        auto a = unwrap(channel::Address::parse(addr));
        Result<channel::Address> bound;
        {
          nb::gil_scoped_release unlocked;
          bound = mesh::Runtime::get().proc().serve_gateway(a);
        }
        return unwrap(std::move(bound)).to_string();
      },
      nb::arg("addr"),
      "DB-8: this process's root proc also accepts on `addr` ('tcp:HOST:PORT') as a gateway "
      "(channel GW-1..GW-4): clients that attach there (`podium debug`, `exec`, `logs`, "
      "`dashboard`) pass the channel's setup (the job's secret, TLS) and reach this proc's "
      "actors. Returns the bound address; again with the same address (or port 0) returns it.");
  m.def(
      "probe",
      [](const std::string& addr, int timeout_ms) -> std::optional<std::string> {
        auto a = unwrap(channel::Address::parse(addr));
        std::optional<std::string> why;
        {
          nb::gil_scoped_release unlocked;
          asio::io_context io;
          channel::probe(io, a, timeout_ms, [&](std::error_code ec) {
            if (ec) why = ec.message();
          });
          io.run();
        }
        return why;
      },
      nb::arg("addr"), nb::arg("timeout_ms"),
      "One plain connect to `addr` (no handshake), closed at once: None when something "
      "accepted it, else why not (refused, unreachable, timed out).");
  m.def("lineage", [] { return mesh::Runtime::get().lineage(); },
        "This process's proc key, then those of the procs it descends from (ME-15).");
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
}

}  // namespace podium::python
