// podium._core.mesh futures: CoreFuture and Notifier.
//
// A CoreFuture wraps the C++ Future of a call's replies. wait() releases the GIL and waits in
// slices of at most 100 ms, taking the GIL between slices only to run Python's signal handlers
// (Ctrl-C) and release_deferred(). A Future never calls into Python when it completes: asyncio
// code registers a Notifier (an eventfd plus a queue of tokens); the completion, on whatever
// C++ thread sets the value, appends the token and writes the eventfd, and the event loop,
// which watches the eventfd with add_reader, drains the tokens on its own thread under the GIL.
//
// Threads: CoreFuture and Notifier may be used from any Python thread; Notifier::push runs on
// whatever C++ thread completes a future and never touches Python.
#include "future.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/vector.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <mutex>

namespace podium::python {

using namespace std::chrono_literals;
using mesh::Replies;

// Tokens of completed futures, for one asyncio event loop. Its lock guards only its own
// token list (no core state): the one place where a C++ completion meets Python's loop.
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

namespace {

// (True, [parts]) or (False, (subsystem, code, message)).
nb::tuple reply_tuple(const mesh::Reply& rep) {
  if (rep) return nb::make_tuple(true, parts_to_python(*rep));
  return nb::make_tuple(false, error_tuple(rep.error()));
}

}  // namespace

bool CoreFuture::wait(std::optional<double> timeout_s) {
  release_deferred();
  if (f_.ready()) return true;
  using Clock = std::chrono::steady_clock;
  auto deadline = Clock::time_point::max();
  if (timeout_s) {
    deadline = Clock::now() + seconds_to_ns(*timeout_s);
  }
  while (true) {
    auto now = Clock::now();
    if (now >= deadline) return f_.ready();
    auto slice = std::chrono::nanoseconds(100ms);
    if (deadline - now < slice) slice = deadline - now;
    {
      nb::gil_scoped_release unlocked;
      // Drives the loop (the reply is read on this thread) until the slice ends, which is
      // at most the deadline: a timed wait overruns it by one handler at worst. A future
      // completed off the loop is waited for without driving it.
      if (drives_) {
        (void)f_.wait_slice(slice);
      } else {
        (void)f_.get(slice);
      }
    }
    if (f_.ready()) return true;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    release_deferred();
  }
}

std::optional<size_t> CoreFuture::rank() const {
  if (!stream_ || !f_.ready()) return std::nullopt;
  return stream_->rank(slot_);
}

void CoreFuture::notify(const std::shared_ptr<Notifier>& n, uint64_t token) {
  f_.on_ready([n, token](const Result<Replies>&) { n->push(token); });
}

nb::list CoreFuture::to_python(bool as_runs) const {
  if (!f_.ready()) throw nb::value_error("the future is not ready");
  const Result<Replies>& r = f_.get();
  if (!r) throw_error(r.error());
  nb::list out;
  for (size_t i = 0; i < r->runs(); ++i) {
    nb::tuple t = reply_tuple(r->run_value(i));
    size_t count = r->run_end(i) - r->run_begin(i);
    if (as_runs) {
      out.append(nb::make_tuple(count, t[0], t[1]));
    } else {
      for (size_t k = 0; k < count; ++k) out.append(t);
    }
  }
  return out;
}

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

CoreFuture from_message(const actor::Future<std::vector<Buffer>>& f) {
  auto p = std::make_shared<actor::Promise<Replies>>();
  CoreFuture out(p->future());
  f.on_ready([p](const Result<std::vector<Buffer>>& r) { p->set(Replies{mesh::Reply(r)}); });
  return out;
}

void bind_futures(nb::module_& m) {
  nb::class_<Notifier>(m, "Notifier")
      .def(nb::new_([] { return std::make_shared<Notifier>(); }))
      .def("fileno", &Notifier::fileno)
      .def("drain", &Notifier::drain);

  nb::class_<CoreFuture>(m, "CoreFuture")
      .def("ready", &CoreFuture::ready)
      .def_prop_ro("drives_loop", &CoreFuture::drives_loop,
                   "Whether wait() drives the proc's loop (False: the future is completed "
                   "off the loop, DA-35).")
      .def("wait", &CoreFuture::wait, nb::arg("timeout_s").none())
      .def("replies", &CoreFuture::replies)
      .def("reply_runs", &CoreFuture::reply_runs)
      .def("rank", &CoreFuture::rank)
      .def("notify", &CoreFuture::notify, nb::arg("notifier"), nb::arg("token"));
}

}  // namespace podium::python
