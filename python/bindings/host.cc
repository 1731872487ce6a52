// podium._core.host: the zygote's side of forking procs (cpp/podium/host/zygote.h).
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common.h"
#include "podium/host/zygote.h"

namespace podium::python {

namespace nb = nanobind;

void bind_host(nb::module_& m) {
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
}

}  // namespace podium::python
