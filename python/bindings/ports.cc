// podium._core.mesh ports: PortReceiver (the receiving end of a Channel, actor/port_receiver.h
// on this process's root proc) and send_port / send_reply, which send to any PortId.
//
// Threads: any Python thread; sends release the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>

#include "future.h"
#include "podium/actor/port_receiver.h"
#include "podium/actor/proc.h"
#include "podium/mesh/runtime.h"

namespace podium::python {

void bind_ports(nb::module_& m) {
  nb::class_<actor::PortReceiver>(m, "PortReceiver")
      .def(
          "__init__",
          [](actor::PortReceiver* self, bool once) {
            new (self) actor::PortReceiver(mesh::Runtime::get().proc(), once);
          },
          nb::arg("once"))
      .def_prop_ro("port_id", &actor::PortReceiver::port_id)
      .def(
          "recv", [](actor::PortReceiver& r) { return from_message(r.recv()); },
          "A future of the next message, in arrival order: one reply, (True, parts) or "
          "(False, error).")
      .def("close", &actor::PortReceiver::close);

  m.def(
      "send_port",
      [](const std::string& port, nb::handle parts) {
        auto bufs = buffers_from_python(parts);
        nb::gil_scoped_release unlocked;
        actor::send_to_port(mesh::Runtime::get().proc(), port, std::move(bufs));
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
}

}  // namespace podium::python
