// Futures of podium._core.mesh (bound in future.cc): CoreFuture wraps the C++ Future of a
// call's replies for Python, which waits on it or awaits it through a Notifier.
//
// Threads: CoreFuture may be used from any Python thread (its C++ future is thread-safe);
// wait() releases the GIL.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "common.h"
#include "podium/actor/future.h"
#include "podium/mesh/cast.h"

namespace podium::python {

class Notifier;

class CoreFuture {
 public:
  explicit CoreFuture(actor::Future<mesh::Replies> f) : f_(std::move(f)) {}
  // Future k of a stream(): rank() names whose reply it is.
  CoreFuture(actor::Future<mesh::Replies> f, std::shared_ptr<const mesh::ReplyStream> stream,
             size_t slot)
      : f_(std::move(f)), stream_(std::move(stream)), slot_(slot) {}

  bool ready() const { return f_.ready(); }
  const actor::Future<mesh::Replies>& future() const { return f_; }
  // A future that no message read by the proc's loop completes (the data plane's: its threads
  // complete it): wait() sleeps on it instead of driving the loop, which it would only keep
  // from a thread that waits for a reply.
  CoreFuture& completed_off_loop() {
    drives_ = false;
    return *this;
  }
  bool drives_loop() const { return drives_; }

  // True once ready; false when `timeout_s` (None: no limit) passed first.
  bool wait(std::optional<double> timeout_s);
  // Per rank: (True, [parts]) or (False, (subsystem, code, message)). Requires ready().
  nb::list replies() const { return to_python(false); }
  // The same as runs of equal replies (ME-9), in rank order: (count, ok, payload) each.
  nb::list reply_runs() const { return to_python(true); }
  // stream(): the rank (in the called region) whose reply this is. Requires ready().
  std::optional<size_t> rank() const;
  void notify(const std::shared_ptr<Notifier>& n, uint64_t token);

 private:
  nb::list to_python(bool as_runs) const;

  actor::Future<mesh::Replies> f_;
  std::shared_ptr<const mesh::ReplyStream> stream_;
  size_t slot_ = 0;
  bool drives_ = true;
};

// A CoreFuture of no replies that completes with `f` (ok: no replies; else its error).
CoreFuture from_void(const actor::Future<void>& f);
// A CoreFuture of one reply: `f`'s value, or its error as that reply (not as the future's).
CoreFuture from_message(const actor::Future<std::vector<Buffer>>& f);

// The mesh submodule's binding files (bind_mesh in mesh.cc calls them, futures first).
void bind_futures(nb::module_& m);
void bind_ports(nb::module_& m);
void bind_runtime(nb::module_& m);
void bind_supervision(nb::module_& m);

}  // namespace podium::python
