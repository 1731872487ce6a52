// The parts of podium._core.data (data.cc) that its files share: the process's engine and
// lease settings (data_engine.cc), the owner's side (data_owner.cc), the reader's side
// (data_transfer.cc). Internal to the bindings.
// Threads: every function here may be called from any thread.
#pragma once

#include <nanobind/nanobind.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "future.h"
#include "podium/actor/message.h"
#include "podium/base/error.h"
#include "podium/data/buffer_table.h"
#include "podium/data/engine.h"
#include "podium/data/lease.h"

namespace podium::python::dataplane {

using Clock = std::chrono::steady_clock;

// --- data_engine.cc ------------------------------------------------------------------------

// This process's engine (DA-1), restricted to the control plane's device (DA-21): made only
// once the runtime runs.
Result<data::Engine*> instance();
// instance(), or a Python exception.
data::Engine& engine();
// DA-48: the numeric address of the control plane's host, when it listens on TCP and a local
// interface holds that address; else "".
std::string control_plane_ip();
// Whether UCX can start here, before the runtime runs (a throwaway engine, made once).
std::pair<bool, std::string> probe();

// The lease time asked for and granted, and the bound on leased transfers (DA-28): from the
// environment, until set_lease() changes them.
struct LeaseSettings {
  std::atomic<int64_t> ms;
  std::atomic<uint64_t> max_bytes;
};
LeaseSettings& lease_settings();
inline constexpr int64_t kMaxLeaseMs = 30000;  // the longest lease an owner grants
// How long an owner presumes a checked transfer without a lease runs, for a reader that does
// not answer a revocation (DA-42): a drop then waits that long for it.
inline constexpr int64_t kCheckedHoldMs = 250;

// `e`, tagged with the index k of an operation of a part (or untagged: its first), tagged
// again with index[k], that operation's index in the whole (a split transfer, an owner's
// group of operations).
Error retag(const Error& e, const std::vector<size_t>& index);
// `e` tagged with the index of the operation it names ("\x1f<op>\x1f...": podium.rdma reads it).
Error tagged(size_t op, const Error& e);

// Counters, for tests and the benchmark.
extern std::atomic<uint64_t> g_checks_answered, g_delayed_releases, g_leased, g_checked,
    g_released_on_revocation, g_revocations_answered, g_revocations_unconfirmed;

// --- data_owner.cc -------------------------------------------------------------------------

// The buffers this process owns.
data::BufferTable& table();
// Releases `retired` at `until` on the proc's loop (DA-27), then runs `then`; both at once
// when that time has passed. Returns what releases them now instead (and runs `then`), once
// whichever comes first (DA-42); empty when released at once.
std::function<void()> release_at(data::BufferTable::Retired retired, std::function<void()> then);
// What a drop or an owner's stop ended: released at the leases' end (release_at), or once
// every lessee confirmed a revocation (DA-42), whichever is first; then `then`.
void retire(data::BufferTable::Retired retired, std::function<void()> then);
// Installs the owner's system operations "rdma_check" and "rdma_drop" (once).
void install_handlers();

// --- data_transfer.cc ----------------------------------------------------------------------

// Sends `h` to the system port of `proc` with a reply port; `done` gets the reply (and the
// number its first part holds, 0 when none), or the error that the proc ended.
void ask_proc(const std::string& proc, const actor::SystemHeader& h,
              std::function<void(const Status&, uint64_t)> done);

// The reader's leases (DA-26); like table(), lives as long as the process.
data::LeaseCache& leases();

// A region as podium.rdma hands it over: a Python buffer (host memory), or a tensor's as the
// tuple (address, size, tensor, cuda): CUDA memory, whose bytes no Python buffer can export
// (DA-23), or a CPU tensor's, without a NumPy array made per transfer. (address, size,
// tensor) is CUDA memory.
struct Region {
  Buffer pinned;
  data::Memory memory = data::Memory::kHost;
};
Region region_from_python(nanobind::handle obj, bool writable);

// One operation as podium.rdma hands it over (see transfer's doc).
// The last element: the owner's TCP bulk address ("" when it has none, DA-48).
using PyOp = std::tuple<bool, std::string, uint64_t, std::string, uint64_t, nanobind::bytes, nanobind::bytes,
                        nanobind::object, size_t, bool, int, bool, nanobind::object, bool,
                        std::string>;

// One-sided operations, checked by their owners or under their leases (see the "transfer"
// binding's doc).
CoreFuture transfer(const std::vector<PyOp>& py_ops, double timeout_s);
// DA-43: one leased same-host operation copied at once: its sum (0 when not summed), or
// nothing when that does not apply or the copy failed (transfer() it then).
std::optional<uint64_t> copy_leased_now(const PyOp& py, double timeout_s);
// DA-42: installs the reader's "rdma_revoke" system operation (once).
void install_revoke_handler();
// A holder's drop of buffer `id` of the proc `owner`: this process's leases of it go first.
CoreFuture drop(const std::string& owner, uint64_t id, const std::string& token,
                double timeout_s);

// --- data_tcp.cc ---------------------------------------------------------------------------

// DA-48: this process's TCP bulk address ("HOST:PORT"), its server started on the first call;
// "" where it has none (a Unix-socket control plane, PODIUM_RDMA_TCP=0, an address no local
// interface holds, or a server that could not start: logged once).
const std::string& bulk_address();
// DA-46: runs `then` once no request of this process's TCP bulk server is in flight on
// buffer `id` (at once where there is no server).
void after_bulk_idle(uint64_t id, std::function<void()> then);
// DA-49: whether podium's TCP path is on in this process (PODIUM_RDMA_TCP, set_tcp_path).
bool tcp_path_on();
// DA-49: whether every operation of a transfer goes over podium's TCP path.
bool bulk_eligible(const std::vector<PyOp>& py_ops);
// DA-49: the operations, each to its owner's TCP bulk server.
CoreFuture bulk_transfer(const std::vector<PyOp>& py_ops, double timeout_s);
// DA-52: `py_ops` (one operation, as transfer() takes it) over the TCP path: its sum (0 when
// not summed) when its caller finished it at once (DA-49), else the CoreFuture it runs under
// (handed over, or failed); None when it does not go over the TCP path (transfer() it then).
nb::object bulk_now(const std::vector<PyOp>& py_ops, double timeout_s);
// DA-49: a transfer with operations both ways: those bulk_eligible over the TCP path, the
// others through `rest`, at once; one reply for all.
CoreFuture split_transfer(const std::vector<PyOp>& py_ops, double timeout_s,
                          const std::function<CoreFuture(const std::vector<PyOp>&, double)>& rest);
// DA-49: whether this process's transfers take podium's TCP path (PODIUM_RDMA_TCP, until
// this is called: tests and the benchmark compare both paths in one run).
void set_tcp_path(bool on);
// Counters of the TCP path, for tests and the benchmark.
nanobind::dict bulk_stats();

}  // namespace podium::python::dataplane
