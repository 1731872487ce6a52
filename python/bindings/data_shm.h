// The reader's windows on owners' shared pages (DA-30), for podium._core.data (data.cc).
// Threads: any; the cache is thread-safe and its sweep runs on the root proc's loop.
#pragma once

#include <nanobind/nanobind.h>
#include <sys/types.h>

#include <memory>

#include "podium/data/shm.h"

namespace podium::python {

// The window of owner `pid`'s shared pages named by `ref` ((fd, ino, dev, begin, end), as
// register_buffer returns it), mapped on first use; null when it cannot be (CMA copies then).
// Arms the sweep that unmaps windows unused for a while.
std::shared_ptr<const data::shm::Window> reader_window(pid_t pid, nanobind::handle ref);
// How many windows (or remembered failures) the reader keeps now.
size_t reader_window_count();

}  // namespace podium::python
