// Whole reads and writes on a descriptor, for the data plane's tests that talk to a child
// process over a socketpair (engine_test.cc, shm_test.cc). Test-only.
#pragma once

#include <unistd.h>

#include <cstddef>

namespace podium::data::testing {

inline bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

inline bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace podium::data::testing
