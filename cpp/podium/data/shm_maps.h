// Internal to the data plane: which pages of this process may move into shared pages (DA-29),
// decided from the kernel's list of the process's mappings. shm.cc asks it before each move.
// Threads: any; no state.
#pragma once

#include <cstdint>
#include <optional>

namespace podium::data::shm::detail {

// Whether [begin, end) (page-aligned) lies wholly in private anonymous writable memory (or in
// pages of podium's own memfds), and, with `device_guard`, no GPU or RDMA device is mapped
// anywhere in the process. Asks with the PROCMAP_QUERY ioctl where the kernel has it (Linux
// 6.11): one query per mapping of the range, and for the guard one per file mapping with no
// name formatted; else reads /proc/self/maps, whose text the kernel formats for every
// mapping (about 0.6 ms in a process with torch loaded, on the 2-core VM).
bool movable(uint64_t begin, uint64_t end, bool device_guard);

// The two forms, for tests. by_query: nullopt where the kernel has no PROCMAP_QUERY, or where
// its answers cannot tell a device from /dev/shm (one filesystem for both).
std::optional<bool> movable_by_query(uint64_t begin, uint64_t end, bool device_guard);
bool movable_by_text(uint64_t begin, uint64_t end, bool device_guard);

}  // namespace podium::data::shm::detail
