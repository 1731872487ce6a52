// Which pages may move into shared pages (DA-29): see shm_maps.h.
#include "podium/data/shm_maps.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "podium/base/unique_fd.h"

namespace podium::data::shm::detail {

namespace {

// The PROCMAP_QUERY ioctl of /proc/<pid>/maps (Linux 6.11, include/uapi/linux/fs.h): the
// build's headers may predate it, and its layout is part of the kernel's ABI.
struct ProcmapQuery {
  uint64_t size;
  uint64_t query_flags;
  uint64_t query_addr;
  uint64_t vma_start;
  uint64_t vma_end;
  uint64_t vma_flags;
  uint64_t vma_page_size;
  uint64_t vma_offset;
  uint64_t inode;
  uint32_t dev_major;
  uint32_t dev_minor;
  uint32_t vma_name_size;
  uint32_t build_id_size;
  uint64_t vma_name_addr;
  uint64_t build_id_addr;
};
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);
constexpr uint64_t kReadable = 0x1, kWritable = 0x2, kExecutable = 0x4, kShared = 0x8;
constexpr uint64_t kCoveringOrNext = 0x10, kFileBacked = 0x20;

// What both forms decide for one mapping of the range: private anonymous writable memory
// (the heap, malloc'd arrays, tensors), or podium's own memfd pages (shared pages no live
// buffer holds, or pages given back, DA-32, which malloc hands out again).
bool may_move(bool rw, bool shared, uint64_t ino, std::string_view path) {
  bool anon = rw && !shared && ino == 0 &&
              (path.empty() || path == "[heap]" || path.starts_with("[anon:"));
  bool ours = rw && path.starts_with("/memfd:podium-rdma");
  return anon || ours;
}

bool device_path(std::string_view path) {
  return path.starts_with("/dev/nvidia") || path.starts_with("/dev/infiniband");
}

}  // namespace

bool movable_by_text(uint64_t begin, uint64_t end, bool device_guard) {
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return false;
  char line[512];
  uint64_t covered = begin;
  bool ok = true;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long long lo = 0, hi = 0, off = 0, ino = 0;
    char perms[8] = {};
    int path_at = 0;
    if (std::sscanf(line, "%llx-%llx %7s %llx %*s %llu %n", &lo, &hi, perms, &off, &ino,
                    &path_at) < 5) {
      continue;
    }
    std::string_view path(line + path_at);
    while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.remove_suffix(1);
    if (device_guard && device_path(path)) {
      ok = false;  // a driver may pin user pages: never move any
      break;
    }
    if (!ok || covered >= end || hi <= covered) continue;
    if (lo > covered) {
      ok = false;  // a hole
      continue;
    }
    std::string_view p(perms);
    ok = may_move(p == "rw-p" || p == "rw-s", p == "rw-s", ino, path);
    covered = hi;
  }
  std::fclose(f);
  return ok && covered >= end;
}

std::optional<bool> movable_by_query(uint64_t begin, uint64_t end, bool device_guard) {
  // The guard tells a device by the filesystem its node lives on, /dev's (a GPU's, an RDMA
  // NIC's, any other driver's: stricter than the names the text form looks for). Where
  // /dev/shm is not a filesystem of its own, UCX's shared-memory files would look like
  // devices too: the text form decides there.
  struct stat dev{}, shm{};
  if (device_guard && (::stat("/dev", &dev) != 0 ||
                       (::stat("/dev/shm", &shm) == 0 && shm.st_dev == dev.st_dev))) {
    return std::nullopt;
  }
  UniqueFd maps(::open("/proc/self/maps", O_RDONLY | O_CLOEXEC));
  if (!maps) return std::nullopt;
  char name[512];
  auto query = [&](uint64_t addr, uint64_t flags, bool named, ProcmapQuery& q) {
    std::memset(&q, 0, sizeof q);
    q.size = sizeof q;
    q.query_flags = flags;
    q.query_addr = addr;
    if (named) {
      q.vma_name_addr = reinterpret_cast<uint64_t>(name);
      q.vma_name_size = sizeof name;
    }
    return ::ioctl(maps.get(), kProcmapQuery, &q) == 0 ? 0 : errno;
  };
  ProcmapQuery q;
  uint64_t covered = begin;
  while (covered < end) {
    int err = query(covered, kCoveringOrNext, true, q);
    if (err == ENOTTY || err == EINVAL) return std::nullopt;  // no PROCMAP_QUERY here
    if (err != 0 || q.vma_start > covered) return false;  // a hole
    std::string_view path(name, q.vma_name_size > 0 ? q.vma_name_size - 1 : 0);
    bool rw = (q.vma_flags & (kReadable | kWritable | kExecutable)) == (kReadable | kWritable);
    if (!may_move(rw, (q.vma_flags & kShared) != 0, q.inode, path)) return false;
    covered = q.vma_end;
  }
  if (!device_guard) return true;
  const uint32_t dev_major = major(dev.st_dev), dev_minor = minor(dev.st_dev);
  for (uint64_t at = 0;;) {
    int err = query(at, kCoveringOrNext | kFileBacked, false, q);
    if (err == ENOENT) return true;  // no file mapping above `at`
    if (err != 0) return std::nullopt;
    if (q.dev_major == dev_major && q.dev_minor == dev_minor) return false;  // a device
    at = q.vma_end;
  }
}

bool movable(uint64_t begin, uint64_t end, bool device_guard) {
  if (auto by_query = movable_by_query(begin, end, device_guard)) return *by_query;
  return movable_by_text(begin, end, device_guard);
}

}  // namespace podium::data::shm::detail
