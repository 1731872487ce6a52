// The reader's windows on owners' shared pages (DA-30): see data_shm.h.
#include "data_shm.h"

#include <nanobind/stl/tuple.h>

#include <asio/steady_timer.hpp>
#include <atomic>
#include <chrono>
#include <tuple>

#include "podium/mesh/runtime.h"

namespace nb = nanobind;

namespace podium::python {
namespace {

using Clock = std::chrono::steady_clock;

// A window unused this long is unmapped (a few leases: a reader that reads every step keeps it).
constexpr auto kIdle = std::chrono::seconds(2);

data::shm::WindowCache& cache() {
  static auto* c = new data::shm::WindowCache();  // lives as long as the process
  return *c;
}

std::atomic<bool> g_sweeping{false};

// Sweeps every kIdle on the root proc's loop while windows are left.
void arm_sweep() {
  auto* rt = mesh::Runtime::current();
  if (rt == nullptr || g_sweeping.exchange(true)) return;
  auto timer = std::make_shared<asio::steady_timer>(rt->proc().io(), kIdle);
  timer->async_wait([timer](std::error_code ec) {
    size_t left = ec ? 1 : cache().sweep(Clock::now(), kIdle);
    g_sweeping = false;
    if (left > 0 && !ec) arm_sweep();
  });
}

}  // namespace

std::shared_ptr<const data::shm::Window> reader_window(pid_t pid, nb::handle ref) {
  auto [fd, ino, dev, begin, end] =
      nb::cast<std::tuple<int, uint64_t, uint64_t, uint64_t, uint64_t>>(ref);
  auto w = cache().get(pid, data::shm::WindowRef{fd, ino, dev, begin, end}, Clock::now());
  arm_sweep();
  return w;
}

size_t reader_window_count() { return cache().size(); }

}  // namespace podium::python
