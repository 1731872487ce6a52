// podium's own same-host copies (DA-10) and the data threads' share of the CPU (DA-11): see
// cma.h and engine.h.
#include "podium/data/cma.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace podium::data {
namespace cma {

// Copies [offset, offset + len) of `o` between this process and its peer: 0, or an errno.
int copy(const Op& o, size_t offset, size_t len) {
  size_t done = 0;
  while (done < len) {
    iovec local{o.local + offset + done, len - done};
    iovec remote{reinterpret_cast<void*>(o.remote_addr + offset + done), len - done};
    ssize_t n = o.kind == Op::Kind::kGet ? ::process_vm_readv(o.peer_pid, &local, 1, &remote, 1, 0)
                                         : ::process_vm_writev(o.peer_pid, &local, 1, &remote, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EFAULT;
    done += static_cast<size_t>(n);
  }
  return 0;
}

void lower_priority(int nice) {
  if (nice <= 0) return;
  pid_t tid = static_cast<pid_t>(::syscall(SYS_gettid));
  errno = 0;
  int now = ::getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
  if (errno != 0) return;
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), std::min(19, now + nice));
}

}  // namespace cma

bool Engine::cma_allowed() {
  const char* env = std::getenv("PODIUM_RDMA_CMA");
  if (env != nullptr && std::string(env) == "0") return false;
  // A seccomp profile (containers) may refuse the calls outright.
  char src[8] = "podium", dst[8] = {};
  iovec local{dst, sizeof dst}, remote{src, sizeof src};
  return ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == sizeof dst &&
         std::memcmp(src, dst, sizeof dst) == 0;
}

size_t Engine::default_copiers() {
  cpu_set_t set;
  CPU_ZERO(&set);
  size_t cpus = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return cpus >= 2 * kMaxDefaultCopiers ? kMaxDefaultCopiers : 1;
}

}  // namespace podium::data
