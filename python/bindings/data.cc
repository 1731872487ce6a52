// podium._core.data: the data plane (cpp/podium/data, docs/data.md) for podium.rdma, the
// module's functions. The reader's side (transfer, copy_now, drop) is data_transfer.cc; the
// process's engine and lease settings data_engine.cc; the owner's system operations
// data_owner.cc; the reader's windows on shared pages data_shm.cc.
//
// The owner's side: register_buffer() registers a Python buffer with this process's engine
// and keeps it in the process's BufferTable under an id and a capability token; the first
// call installs the "rdma_check" and "rdma_drop" system operations on this process's root
// proc, through which readers ask the owner to check a token before a transfer, and holders
// drop the buffer.
//
// Threads: any Python thread. No C++ thread takes the GIL: a pinned Python buffer is released
// later under the GIL (common.h).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "data_internal.h"
#include "data_shm.h"
#include "future.h"
#include "podium/data/buffer_table.h"
#include "podium/data/engine.h"
#include "podium/data/lease.h"
#include "podium/mesh/runtime.h"

namespace podium::python {

using namespace dataplane;  // data_internal.h

void bind_data(nb::module_& m) {
  m.def(
      "copy_now",
      [](const PyOp& op, double timeout_s) {
        release_deferred();
        install_revoke_handler();
        return copy_leased_now(op, timeout_s);
      },
      nb::arg("op"), nb::arg("timeout_s"),
      "DA-43: copies the one operation `op` (as transfer() takes each) at once on this thread "
      "when it is a same-host one under a usable lease that its caller may copy whole (DA-31); "
      "then the sum of a summed read (DA-41), else 0. None when that does not apply or the "
      "copy failed: transfer() it then, which also reports the failure.");
  m.def(
      "available",
      [] {
        if (mesh::Runtime::current() == nullptr) {
          auto [ok, why] = probe();
          return nb::make_tuple(ok, why);
        }
        auto e = instance();
        return nb::make_tuple(e.has_value(), e ? std::string() : e.error().message);
      },
      "(True, '') when this process's data plane (a UCX context and worker) runs, starting "
      "it on first use (DA-1); else (False, why). Before the podium runtime runs: whether "
      "UCX can start (a throwaway engine), since the engine is made for the proc's address "
      "(DA-21).");
  m.def("ucx_version", &data::Engine::ucx_version, "The version of the UCX library in use.");
  m.def(
      "net_devices", [] { return engine().net_devices(); },
      "The network devices UCX may use in this process (DA-21): UCX_NET_DEVICES when set, "
      "else the interface of this process's control-plane address ('lo' on Unix sockets); "
      "'' when neither applies (UCX's default, every device). Starts the data plane.");
  m.def(
      "cuda_supported", [] { return engine().supports(data::Memory::kCuda); },
      "Whether this process's UCX reaches CUDA memory (DA-23). Starts the data plane.");
  m.def("cma_allowed", &data::Engine::cma_allowed,
        "Whether same-host transfers are copied with CMA (DA-10; PODIUM_RDMA_CMA=0: never).");
  m.def(
      "worker_address", [] { return nb::bytes(engine().address().data(), engine().address().size()); },
      "This process's UCX worker address (what readers' endpoints are made from).");
  m.def(
      "register_buffer",
      [](nb::handle obj, const std::string& owner, bool share) {
        release_deferred();
        install_handlers();
        bool writable = true;
        Region region;
        try {
          region = region_from_python(obj, true);
        } catch (nb::python_error&) {
          writable = false;
          region = region_from_python(obj, false);
        }
        const std::byte* data = region.pinned.data();
        size_t size = region.pinned.size();
        if (size == 0) throw nb::value_error("cannot register an empty buffer");
        auto keep = std::make_shared<Buffer>(std::move(region.pinned));
        Result<std::shared_ptr<data::Registration>> registered;
        {
          nb::gil_scoped_release unlocked;  // DA-29 may copy the region into shared pages
          registered = engine().register_memory(data, size, keep, region.memory, share);
        }
        auto reg = unwrap(std::move(registered));
        std::string rkey = reg->rkey();
        uint64_t addr = reg->addr();
        auto win = reg->window();
        auto added = unwrap(table().add(std::move(reg), owner, writable));
        const auto& w = engine().address();
        nb::object window = win.valid() ? nb::object(nb::make_tuple(win.fd, win.ino, win.dev,
                                                                    win.begin, win.end))
                                        : nb::none();
        return nb::make_tuple(added.id, added.token, addr, size, nb::bytes(rkey.data(), rkey.size()),
                              nb::bytes(w.data(), w.size()), writable, window,
                              region.memory == data::Memory::kHost ? bulk_address()
                                                                   : std::string());
      },
      nb::arg("obj"), nb::arg("owner"), nb::arg("share") = true,
      "Registers the C-contiguous buffer `obj` (or a tensor's region (address, size, tensor"
      "[, cuda]), DA-23) for `owner` (an actor id); returns (id, token, "
      "addr, size, rkey, worker_address, writable, window): window is (fd, ino, dev, begin, end) "
      "of its shared pages (DA-29), or None. share=False: its pages are not moved into shared "
      "pages (DA-38). The buffer stays pinned and registered until drop or release_owner "
      "(DA-8).");
  m.def(
      "drop",
      [](const std::string& owner, uint64_t id, const std::string& token, double timeout_s) {
        release_deferred();
        return drop(owner, id, token, timeout_s);
      },
      nb::arg("owner"), nb::arg("id"), nb::arg("token"), nb::arg("timeout_s"),
      "Asks the proc `owner` to drop its buffer `id` (its registration is released, DA-8, once "
      "every reader it leased the buffer to confirmed a revocation, DA-42, or once those leases "
      "ended, DA-27; the Future resolves then).");
  m.def(
      "release_owner",
      [](const std::string& owner) {
        auto r = table().release_owner(owner);
        size_t n = r.regs.size();
        retire(std::move(r), nullptr);  // DA-27, DA-42
        return n;
      },
      nb::arg("owner"),
      "Ends every buffer of the actor `owner` (it stopped); returns how many. Their "
      "registrations are released once every reader leased one of them confirmed a "
      "revocation (DA-42), or once those leases ended (DA-27).");
  m.def(
      "lease_config",
      [] {
        return nb::make_tuple(lease_settings().ms.load(), lease_settings().max_bytes.load());
      },
      "(lease ms, max bytes): the lease this process asks for and grants at most, and the "
      "largest transfer that uses leases (PODIUM_RDMA_LEASE_MS, PODIUM_RDMA_LEASE_MAX_BYTES; "
      "DA-28).");
  m.def(
      "set_lease",
      [](int64_t ms, uint64_t max_bytes) {
        lease_settings().ms = ms;
        lease_settings().max_bytes = max_bytes;
      },
      nb::arg("ms"), nb::arg("max_bytes"),
      "Sets this process's lease time (0: no leases) and bound, as the environment would "
      "(tests, benchmarks).");
  m.def(
      "lease_left",
      [](const std::string& owner, uint64_t id, bool write) {
        auto left = leases().left(owner, id, write, Clock::now());
        return std::chrono::duration<double>(left).count();
      },
      nb::arg("owner"), nb::arg("id"), nb::arg("write"),
      "Seconds left of this process's lease on buffer `id` of the proc `owner` (0: none).");
  m.def("set_tcp_path", &set_tcp_path, nb::arg("on"),
        "DA-49: whether this process's own transfers take podium's TCP path between hosts "
        "(PODIUM_RDMA_TCP until then); off, they go through UCX. For tests and benchmarks.");
  m.def("tcp_stats", &bulk_stats,
        "Counters of podium's TCP path between hosts (DA-48, DA-49): transfers that took it, "
        "those finished by their caller, handed over, failed; idle connections kept; and, "
        "where this process serves one, its server's address and counters (DA-45).");
  m.def(
      "lease_stats",
      [] {
        nb::dict d;
        d["checks_answered"] = g_checks_answered.load();
        d["delayed_releases"] = g_delayed_releases.load();
        d["leased"] = g_leased.load();
        d["checked"] = g_checked.load();
        d["leases"] = leases().size();
        d["released_on_revocation"] = g_released_on_revocation.load();
        d["revocations_answered"] = g_revocations_answered.load();
        d["revocations_unconfirmed"] = g_revocations_unconfirmed.load();
        return d;
      },
      "Counters of leases (DA-26..DA-28, DA-42): checks this process answered as an owner, "
      "drops and releases it delayed for a lease, transfers it ran under leases and checked, "
      "leases held, drops and owner stops whose buffers it released once every lessee "
      "confirmed a revocation (before the leases' end), revocations it answered as a reader, "
      "revocations it asked for that a lessee did not confirm (its proc ended, the message "
      "failed).");
  m.def("bulk_now", &bulk_now, nb::arg("ops"), nb::arg("timeout_s"),
        "DA-52: runs `ops` (one operation, as transfer() takes it) over podium's TCP path when "
        "it goes that way (DA-49): its sum (0 when not summed, DA-41) when its caller finished "
        "it at once, else the CoreFuture it runs under (handed over, or failed); None when it "
        "does not go over the TCP path (transfer() it then).");
  m.def("transfer", &transfer, nb::arg("ops"), nb::arg("timeout_s"),
        "Runs one-sided operations, each (write, owner_proc, id, token, remote_addr, rkey, "
        "worker_address, local, size, same_host, owner_pid, remote_cuda, window, checksum): "
        "checked by their owners, then in parallel (same_host: the owner runs on this host, DA-9; "
        "its pid: CMA, DA-10; window: the buffer's shared pages, register_buffer's, DA-30). A "
        "CoreFuture of one reply; with a summed read (checksum, DA-41), its one part holds every "
        "operation's word sum (DA-40), 8 bytes little-endian each.");
  m.def(
      "registration_count",
      [] {
        if (mesh::Runtime::current() == nullptr) return size_t{0};
        auto e = instance();
        return e ? (*e)->registration_count() : size_t{0};
      },
      "Regions this process has registered now (DA-2).");
  m.def("buffer_count", [] { return table().size(); }, "Buffers this process owns now.");
  m.def(
      "wait_given_back",
      [] {
        nb::gil_scoped_release unlocked;
        data::shm::wait_given_back();
      },
      "Waits until the pages of every buffer of this process that ended are private again "
      "(DA-32: the give-back runs on a thread of its own; benchmarks wait for it so that it "
      "does not share the CPU with what they time next).");
  m.def(
      "stats",
      [] {
        auto s = engine().stats();
        nb::dict d;
        d["transfers"] = s.transfers;
        d["chunks"] = s.chunks;
        d["bytes"] = s.bytes;
        d["timeouts"] = s.timeouts;
        d["endpoints"] = s.endpoints;
        d["active"] = s.active;
        d["copiers"] = s.copiers;
        d["window_bytes"] = s.window_bytes;
        d["caller_copied"] = s.caller_copied;
        d["windows"] = reader_window_count();
        d["ucx_tcp"] = engine().ucx_tcp();  // DA-51
        return d;
      },
      "The engine's counters, and whether UCX's tcp transport runs in it (DA-51).");
}

}  // namespace podium::python
