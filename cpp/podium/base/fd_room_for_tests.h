// podium::ScopedFdRoom — for tests only: this process's soft RLIMIT_NOFILE lowered to leave
// room for `room` more descriptors than are open now, put back by restore() or the destructor.
// Threads: one test's thread; the limit is the whole process's.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

namespace podium {

class ScopedFdRoom {
 public:
  explicit ScopedFdRoom(int room) {
    if (::getrlimit(RLIMIT_NOFILE, &old_) != 0) return;
    const int probe = ::dup(0);  // the lowest free descriptor
    if (probe < 0) return;
    ::close(probe);
    limit_ = probe + room;
    rlimit low = old_;
    low.rlim_cur = static_cast<rlim_t>(limit_);
    ok_ = ::setrlimit(RLIMIT_NOFILE, &low) == 0;
  }
  ~ScopedFdRoom() { restore(); }
  ScopedFdRoom(const ScopedFdRoom&) = delete;
  ScopedFdRoom& operator=(const ScopedFdRoom&) = delete;

  bool ok() const { return ok_; }
  int limit() const { return limit_; }  // the soft limit while lowered
  bool restore() {
    if (!ok_) return true;
    ok_ = false;
    return ::setrlimit(RLIMIT_NOFILE, &old_) == 0;
  }

 private:
  rlimit old_{};
  int limit_ = 0;
  bool ok_ = false;
};

}  // namespace podium
