// Internal to podium_channel: the receiving side's copies of lent parts (CH-25, WI-8).
//
// A sender on a Unix-socket link lends a large part instead of writing it to the socket; the
// receiver pulls it from the sender's memory with process_vm_readv, here, on the puller
// threads: never on an io thread, so other links keep flowing while a large part is copied.
// Parts are cut into chunks of kPullChunkBytes; the threads take chunks round robin over the
// pulls in progress (a small pull behind a large one waits for at most one chunk per
// thread), at a lower priority than the process (as the data plane's CMA copies, DA-11).
//
// Threads: pull_async() and probe_peer() are thread-safe. The pool's threads are started on
// first use and live until the process exits.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <cstdint>
#include <functional>
#include <vector>

#include "podium/base/buffer.h"
#include "podium/wire/message.h"

namespace podium::channel::internal {

inline constexpr size_t kPullChunkBytes = size_t{4} << 20;

// `err` is 0, or the errno of the first chunk that failed (ESRCH: the peer ended; EPERM: the
// kernel refuses; EFAULT: the range is not mapped in the peer; ENOMEM: no memory here).
// `parts` holds one received Buffer per lent part (BU-1), in the order of the request.
using PullDone = std::function<void(int err, std::vector<Buffer> parts)>;

// Allocates each part and copies it from `pid`; `done` runs on a puller thread. Once
// `*cancel` is true, the chunks not yet copied are skipped and `done` gets ECANCELED.
// `ready`, when not empty, has one Buffer per lent part: those not empty were taken already
// (a mapped shared block, CH-29) and are neither mapped nor pulled again.
void pull_async(pid_t pid, const std::vector<wire::LentPart>& lent,
                std::shared_ptr<const std::atomic<bool>> cancel, PullDone done,
                std::vector<Buffer> ready = {});

// Starts the puller threads if they are not running yet: while idle they also sweep the warm
// blocks (CH-27) and the shared blocks (CH-29), so a process that only sends starts them too.
void start_pullers();

// Whether this process can read `pid`'s memory: the 8 bytes at `addr` are `value` (0), or
// the errno (EIO: other bytes there, so another process or a wrong address).
int probe_peer(pid_t pid, uint64_t addr, uint64_t value);

// Pulls started and pulls that failed, since the process started (tests, stats).
struct PullCounts {
  uint64_t started = 0;
  uint64_t failed = 0;
};
PullCounts pull_counts();

}  // namespace podium::channel::internal
