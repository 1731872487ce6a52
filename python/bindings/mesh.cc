// podium._core.mesh: HostMesh / ProcMesh / ActorMesh handles (mesh/proc_mesh.h), and, from
// the files beside this one, futures (future.cc), ports (ports.cc), the runtime's functions
// (runtime.cc) and the faults of this process's root (supervision.cc).
//
// This file converts and forwards: every method below calls one C++ member of the handle and
// converts its arguments and result. Errors become exceptions through unwrap() (common.h);
// futures become CoreFutures (future.h).
//
// Mesh state. state() / from_state() turn a ProcMesh or ActorMesh handle into plain Python
// values and back (the C++ ProcMeshRef / ActorMeshRef of mesh/mesh_ref.h), so that Python can
// pickle meshes: a rebuilt handle addresses the same procs and actors (MR-1); its
// `initialized` is resolved (the spawner owns it).
//
// Threads: the mesh handles may be used from any Python thread; their C++ state is
// thread-safe. Every function that waits, sends or spawns releases the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common.h"
#include "future.h"
#include "podium/mesh/mesh_ref.h"
#include "podium/mesh/proc_mesh.h"

namespace podium::python {
namespace {

// --- mesh state, for pickling (mesh_ref.h as Python values) --------------------------------

// (proc id text, pid, host name) per base rank of the root mesh.
using ProcsState = std::vector<std::tuple<std::string, int64_t, std::string>>;
// One proc's launch (mesh/launch.h) as Python gives it:
// (program, argv, env, unset, inherit_env, bind).
using StrPairs = std::vector<std::pair<std::string, std::string>>;
using LaunchTuple = std::tuple<std::string, std::vector<std::string>, StrPairs,
                               std::vector<std::string>, bool, StrPairs>;

std::vector<mesh::ProcLaunch> to_launches(std::vector<LaunchTuple> in) {
  std::vector<mesh::ProcLaunch> out;
  for (auto& [program, argv, env, unset, inherit, bind] : in) {
    out.push_back(mesh::ProcLaunch{std::move(program), std::move(argv), std::move(env),
                                   std::move(unset), inherit, std::move(bind)});
  }
  return out;
}
// (addr, mailbox dest, actor id, proc key) per base rank; None where no actor was spawned.
using TargetState = std::optional<std::tuple<std::string, std::string, std::string, std::string>>;

ProcsState procs_state(const mesh::ProcMeshRef& ref) {
  ProcsState out;
  for (const auto& p : ref.procs) out.emplace_back(p.id, p.pid, p.host);
  return out;
}

mesh::ProcMeshRef procs_ref(std::vector<std::string> labels, std::vector<size_t> sizes,
                            const ProcsState& procs, const RegionState& region,
                            std::vector<std::string> spawners) {
  mesh::ProcMeshRef ref{std::move(labels), std::move(sizes), {}, region_from_state(region),
                        std::move(spawners)};
  for (const auto& [id, pid, host] : procs) ref.procs.push_back(mesh::ProcRef{id, pid, host});
  return ref;
}

nb::tuple proc_mesh_state(const ProcMesh& p) {
  auto ref = p.ref();
  return nb::make_tuple(ref.labels, ref.sizes, procs_state(ref), region_state(ref.region),
                        ref.spawners);
}

ProcMesh proc_mesh_from_state(std::vector<std::string> labels, std::vector<size_t> sizes,
                              const ProcsState& procs, const RegionState& region,
                              std::vector<std::string> spawners) {
  return unwrap(ProcMesh::from_ref(
      procs_ref(std::move(labels), std::move(sizes), procs, region, std::move(spawners))));
}

nb::tuple actor_mesh_state(const ActorMeshBase& a) {
  auto ref = a.ref();
  std::vector<TargetState> targets;
  for (const auto& t : ref.targets) {
    if (t) {
      targets.emplace_back(std::make_tuple(t->addr, t->dest, t->actor, t->proc_key));
    } else {
      targets.emplace_back(std::nullopt);
    }
  }
  return nb::make_tuple(ref.name, ref.procs.labels, ref.procs.sizes, procs_state(ref.procs),
                        targets, region_state(ref.procs.region), ref.procs.spawners);
}

ActorMeshBase actor_mesh_from_state(const std::string& name, std::vector<std::string> labels,
                                    std::vector<size_t> sizes, const ProcsState& procs,
                                    const std::vector<TargetState>& targets,
                                    const RegionState& region,
                                    std::vector<std::string> spawners) {
  mesh::ActorMeshRef ref;
  ref.name = name;
  ref.procs =
      procs_ref(std::move(labels), std::move(sizes), procs, region, std::move(spawners));
  for (const auto& t : targets) {
    if (t) {
      const auto& [addr, dest, actor, key] = *t;
      ref.targets.emplace_back(mesh::ActorRef{addr, dest, actor, key});
    } else {
      ref.targets.emplace_back(std::nullopt);
    }
  }
  return unwrap(ActorMeshBase::from_ref(ref));
}

// --- bound twice -----------------------------------------------------------------------------

// slice / split / flatten / rename of ProcMesh and ActorMesh: the same handle on another
// region of its procs or actors.
template <class Mesh>
void bind_shapes(nb::class_<Mesh>& cls) {
  cls.def_prop_ro("region", &Mesh::region)
      .def_prop_ro("extent", &Mesh::extent)
      .def_prop_ro("size", &Mesh::size)
      .def("slice", [](const Mesh& m, std::string_view label,
                       int64_t i) { return unwrap(m.slice(label, i)); })
      .def("slice", [](const Mesh& m, std::string_view label,
                       const ndslice::Range& r) { return unwrap(m.slice(label, r)); })
      .def("split",
           [](const Mesh& m, std::string_view label, std::vector<std::string> labels,
              std::vector<int64_t> sizes) {
             return unwrap(m.split(label, std::move(labels), std::move(sizes)));
           })
      .def("flatten", [](const Mesh& m, std::string label) {
        return unwrap(m.flatten(std::move(label)));
      })
      .def("rename", [](const Mesh& m, std::string_view from, std::string to) {
        return unwrap(m.rename(from, std::move(to)));
      });
}

// Runs `f` with the GIL released and returns its value, or raises its error.
template <class F>
auto released(F&& f) {
  decltype(f()) r = [&] {
    nb::gil_scoped_release unlocked;
    return f();
  }();
  return unwrap(std::move(r));
}

void bind_host_mesh(nb::module_& m) {
  nb::class_<HostMesh>(m, "HostMesh")
      .def(nb::init<>(), "This host (no dimensions).")
      .def_static(
          "attach",
          [](std::vector<std::string> workers) {
            return released([&] { return HostMesh::attach(workers); });
          },
          nb::arg("workers"),
          "The workers (tcp://HOST:PORT) as a mesh {'hosts': N}; returns at once.")
      .def_prop_ro("region", &HostMesh::region)
      .def("with_region", &HostMesh::with_region, nb::arg("region"))
      .def("initialized", [](const HostMesh& h) { return from_void(h.initialized()); })
      .def(
          "shutdown",
          [](const HostMesh& h) { return from_void(released([&] { return h.shutdown(); })); },
          "Ends this controller's use of these hosts: their procs are killed, as stopped.")
      .def(
          "spawn_procs",
          [](const HostMesh& h, std::vector<std::pair<std::string, size_t>> per_host,
             const std::string& name, std::vector<LaunchTuple> launches) {
            auto l = to_launches(std::move(launches));
            return released([&] { return h.spawn_procs(per_host, name, l); });
          },
          nb::arg("per_host"), nb::arg("name") = std::string(),
          nb::arg("launches") = std::vector<LaunchTuple>{},
          "`launches`: none, or one per proc: (program, argv, env, unset, inherit_env, bind) "
          "(mesh/launch.h).")
      .def(
          "find_procs",
          [](const HostMesh& h, const std::string& name) {
            return released([&] { return h.find_procs(name); });
          },
          nb::arg("name"),
          "The proc mesh `name` that persistent workers kept; this process owns it now.")
      .def(
          "hosts",
          [](const HostMesh& h) {
            std::vector<std::tuple<std::string, std::string, bool, std::optional<std::string>>> out;
            for (auto& host : h.hosts()) {
              out.emplace_back(std::move(host.worker), std::move(host.hostname), host.attached,
                               std::move(host.failure));
            }
            return out;
          },
          "Per host: (worker address, host name, attached, failure or None).");
}

void bind_proc_mesh(nb::module_& m) {
  nb::class_<ProcMesh> cls(m, "ProcMesh");
  cls.def_static(
         "spawn_procs",
         [](std::vector<std::pair<std::string, size_t>> per_host,
            std::vector<LaunchTuple> launches) {
           auto l = to_launches(std::move(launches));
           return released([&] { return this_host().spawn_procs(per_host, {}, l); });
         },
         nb::arg("per_host"), nb::arg("launches") = std::vector<LaunchTuple>{})
      .def_static("this_proc", [] { return this_proc(); });
  bind_shapes(cls);
  // The future keeps the mesh alive: `spawn_procs(...).initialized.get()` on a temporary
  // must not abandon the promise its mesh holds.
  cls.def("initialized", [](const ProcMesh& p) { return from_void(p.initialized()); },
          nb::keep_alive<0, 1>())
      .def(
          "spawn",
          [](const ProcMesh& p, const std::string& type, std::string name, nb::handle parts,
             std::optional<std::string> owner) {
            auto bufs = buffers_from_python(parts);
            return released([&] {
              return p.spawn_raw(type, std::move(name), std::move(bufs), std::move(owner));
            });
          },
          nb::arg("type"), nb::arg("name"), nb::arg("parts"),
          nb::arg("owner").none() = std::string(),
          "Spawns; `owner` (an actor id, '' for this process's root, None for nobody) is told "
          "when an actor of the mesh fails.")
      .def(
          "adopt",
          [](const ProcMesh& p, std::string name, std::optional<std::string> owner) {
            return released([&] { return p.adopt_raw(std::move(name), std::move(owner)); });
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
           "(root labels, root sizes, [(proc id, pid, host)], region state, spawners), for "
           "pickling.")
      .def_static("from_state", &proc_mesh_from_state, nb::arg("labels"), nb::arg("sizes"),
                  nb::arg("procs"), nb::arg("region"),
                  nb::arg("spawners") = std::vector<std::string>{},
                  "A handle on procs that another process spawned (see state()).")
      .def("spawned_for", &ProcMesh::spawned_for, nb::arg("lineage"),
           "ME-15: these procs (spawned here on attached hosts) belong to the proc "
           "lineage[0] (then the procs it descends from): they stop when one of those "
           "stops and are killed when one fails.")
      .def(
          "ended",
          [](const ProcMesh& p) {
            nb::gil_scoped_release unlocked;
            return from_void(p.ended());
          },
          "Resolves once every proc of the mesh is known here to have ended.")
      .def(
          "stop_after",
          [](const ProcMesh& p, std::vector<const CoreFuture*> first, int64_t wait_ms,
             int64_t grace_ms) {
            std::vector<actor::Future<mesh::Replies>> futures;
            for (const auto* f : first) futures.push_back(f->future());
            nb::gil_scoped_release unlocked;
            return from_void(p.stop_after(std::move(futures), std::chrono::milliseconds(wait_ms),
                                          std::chrono::milliseconds(grace_ms)));
          },
          nb::arg("first"), nb::arg("wait_ms"), nb::arg("grace_ms"),
          "Stops the procs once every future in `first` is ready or after wait_ms.");
}

void bind_actor_mesh(nb::module_& m) {
  nb::class_<ActorMeshBase> cls(m, "ActorMesh");
  cls.def_prop_ro("name", &ActorMeshBase::name);
  bind_shapes(cls);
  cls.def("initialized", [](const ActorMeshBase& a) { return from_void(a.initialized()); },
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
            std::vector<std::vector<Buffer>> per_rank;
            for (nb::handle parts : per_rank_parts) per_rank.push_back(buffers_from_python(parts));
            if (per_rank.size() != a.size()) {
              throw nb::value_error("stream needs one list of parts per rank");
            }
            std::shared_ptr<mesh::ReplyStream> stream = released([&] {
              return a.stream_raw(endpoint, std::move(per_rank));
            });
            std::vector<CoreFuture> out;
            auto futures = stream->futures();
            out.reserve(futures.size());
            for (size_t k = 0; k < futures.size(); ++k) out.emplace_back(futures[k], stream, k);
            return out;
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
            released([&] { return a.cast_to_port(endpoint, std::move(bufs), reply_port, only); });
          },
          nb::arg("endpoint"), nb::arg("parts"), nb::arg("reply_port"),
          nb::arg("only").none() = nb::none(),
          "Sends to every actor of the region (or to rank `only`), answers going to "
          "`reply_port` (empty: one-way).")
      .def("state", &actor_mesh_state,
           "(name, root labels, root sizes, [(proc id, pid, host)], [target], region state, "
           "spawners).")
      .def_static("from_state", &actor_mesh_from_state, nb::arg("name"), nb::arg("labels"),
                  nb::arg("sizes"), nb::arg("procs"), nb::arg("targets"), nb::arg("region"),
                  nb::arg("spawners") = std::vector<std::string>{},
                  "A handle on actors that another process spawned (see state()).")
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
            auto info = unwrap(a.rank_info(rank));
            return nb::make_tuple(info.actor, info.pid, info.host, info.base_rank, info.point);
          },
          nb::arg("rank"),
          "(actor id, pid of its proc, host, rank and coordinates in the ProcMesh) of rank "
          "`rank` of this region.");
}

}  // namespace

// A future that completes once every one of `futures` is ready (their values and errors
// stay in them: read them afterwards).
CoreFuture all_of(std::vector<const CoreFuture*> futures) {
  struct All {
    actor::Promise<void> done;
    std::atomic<size_t> left{0};
  };
  auto all = std::make_shared<All>();
  auto out = from_void(all->done.future());
  all->left = futures.size() + 1;
  auto one = [all](const Result<mesh::Replies>&) {
    if (all->left.fetch_sub(1) == 1) all->done.set({});
  };
  for (const auto* f : futures) f->future().on_ready(one);
  one(Result<mesh::Replies>{});
  return out;
}

void bind_mesh(nb::module_& m) {
  bind_futures(m);  // first: the classes below return CoreFutures
  m.def("all_of", &all_of, nb::arg("futures"),
        "A future that completes once every one of `futures` is ready (read them then).");
  bind_supervision(m);
  bind_runtime(m);
  bind_ports(m);
  bind_host_mesh(m);
  bind_proc_mesh(m);
  bind_actor_mesh(m);
}

}  // namespace podium::python
