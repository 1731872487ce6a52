// podium::write_all — a blocking write of all of `data` to `fd`, EINTR retried. What the
// writers of proc output to a terminal or pipe share (the stdio gate, the output writer, the
// spawner's pass-through); they give up quietly on an error (a closed terminal: the procs'
// log files have the lines).
#pragma once

#include <unistd.h>

#include <cerrno>
#include <string_view>

namespace podium {

// False on an error other than EINTR (nothing more is written then).
inline bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

}  // namespace podium
