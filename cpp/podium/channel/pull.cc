// The puller threads of CH-25: see pull.h.
#include "podium/channel/pull.h"
#include "podium/base/env.h"
#include "podium/channel/shared_parts.h"
#include "podium/channel/warm_blocks.h"

#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace podium::channel::internal {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

std::atomic<uint64_t> g_started{0}, g_failed{0};

struct Job {
  pid_t pid = 0;
  std::vector<wire::LentPart> lent;
  std::vector<std::byte*> dst;  // per lent part: where it is pulled to (null: mapped)
  std::vector<Buffer> out;
  std::vector<size_t> todo;     // the lent parts to pull, after prepare()
  PullDone done;
  std::shared_ptr<const std::atomic<bool>> cancel;
  // Guarded by the pool's mutex: whether a thread took the job to prepare it, and the next
  // chunk to hand out (todo[part] at offset).
  bool prepared = false;
  size_t part = 0, offset = 0;
  std::atomic<size_t> running{0};  // chunks handed out and not finished
  std::atomic<int> err{0};
};

// Copies `len` bytes at `remote` in `pid` to `local`: 0 or an errno.
int read_peer(pid_t pid, std::byte* local, uint64_t remote, size_t len) {
  size_t done = 0;
  while (done < len) {
    iovec l{local + done, len - done};
    iovec r{reinterpret_cast<void*>(remote + done), len - done};
    ssize_t n = ::process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EFAULT;
    done += size_t(n);
  }
  return 0;
}

// CH-27: a received part's block goes back to the warm blocks when its Buffer is released.
struct GiveBack {
  size_t len = 0;
  void operator()(void* p) const { give_warm(p, len); }
};

class Pool {
 public:
  Pool() {
    cpu_set_t set;
    CPU_ZERO(&set);
    size_t cpus = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    // As the data plane's copiers (DA-11): at most half the CPUs, two at most by default.
    size_t threads = size_t(env_number("PODIUM_RDMA_CMA_THREADS").value_or(cpus >= 4 ? 2 : 1));
    int nice = int(std::min<uint64_t>(env_number("PODIUM_RDMA_NICE").value_or(5), 19));
    threads = std::clamp<size_t>(threads, 1, 16);
    for (size_t i = 0; i < threads; ++i) {
      std::thread([this, nice] { run(nice); }).detach();
    }
  }

  void add(std::shared_ptr<Job> job) {
    {
      std::lock_guard lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_all();
  }

 private:
  void run(int nice) {
    if (nice > 0) {
      pid_t tid = static_cast<pid_t>(::syscall(SYS_gettid));
      errno = 0;
      int now = ::getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
      if (errno == 0) (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), std::min(19, now + nice));
    }
    for (;;) {
      std::shared_ptr<Job> job;
      size_t part, offset, len;
      {
        std::unique_lock lock(mu_);
        while (!cv_.wait_for(lock, std::chrono::seconds(1), [&] { return !jobs_.empty(); })) {
          lock.unlock();
          sweep_warm();  // CH-27: kept blocks do not outlive their idle time by much
          sweep_shared();  // CH-29: nor do shared blocks
          lock.lock();
        }
        job = jobs_.front();
        jobs_.pop_front();
        if (!job->prepared) {
          // One thread maps the shared blocks and allocates the rest (CH-29), then the
          // parts left to pull go round robin with the others.
          job->prepared = true;
          lock.unlock();
          prepare(*job);
          lock.lock();
          if (job->err.load() != 0 || job->todo.empty()) {
            lock.unlock();
            finish(*job);
            continue;
          }
          jobs_.push_front(job);
          cv_.notify_all();
          continue;
        }
        part = job->todo[job->part];
        offset = job->offset;
        len = std::min<size_t>(kPullChunkBytes, job->lent[part].len - offset);
        job->offset += len;
        if (job->offset == job->lent[part].len) {
          ++job->part;
          job->offset = 0;
        }
        job->running.fetch_add(1, std::memory_order_relaxed);
        // Round robin: a job with chunks left goes behind the others.
        if (job->part < job->todo.size()) jobs_.push_back(job);
      }
      if (job->cancel->load(std::memory_order_relaxed)) {
        int zero = 0;
        job->err.compare_exchange_strong(zero, ECANCELED);
      }
      if (job->err.load(std::memory_order_relaxed) == 0) {
        int e = read_peer(job->pid, job->dst[part] + offset, job->lent[part].addr + offset, len);
        if (e != 0) {
          int zero = 0;
          job->err.compare_exchange_strong(zero, e);
        }
      }
      bool last;
      {
        std::lock_guard lock(mu_);
        last = job->running.fetch_sub(1, std::memory_order_acq_rel) == 1 &&
               job->part == job->todo.size();
      }
      if (last) finish(*job);
    }
  }

  // Takes each part that names a shared block as that block (CH-29), and allocates the
  // others, to be pulled.
  static void prepare(Job& job) {
    job.out.resize(job.lent.size());
    job.dst.assign(job.lent.size(), nullptr);
    for (size_t i = 0; i < job.lent.size(); ++i) {
      const auto& l = job.lent[i];
      if (!job.out[i].empty()) continue;  // taken already
      if (auto mapped = map_shared(job.pid, l)) {
        job.out[i] = std::move(*mapped);
        continue;
      }
      void* p = nullptr;
      // Large parts on huge-page boundaries, so that the copy faults in 2 MiB at a time.
      size_t align = l.len >= kHugePage ? kHugePage : alignof(std::max_align_t);
      bool warm = false;
      if (l.len > size_t(PTRDIFF_MAX) || (p = take_warm(size_t(l.len), align, &warm)) == nullptr) {
        job.err.store(ENOMEM);
        return;
      }
      // A fresh block asks for huge pages; a warm one has them already.
      if (l.len >= kHugePage && !warm) (void)::madvise(p, size_t(l.len), MADV_HUGEPAGE);
      std::shared_ptr<void> owner(p, GiveBack{size_t(l.len)});
      job.dst[i] = static_cast<std::byte*>(p);
      job.out[i] = Buffer::received(std::move(owner), static_cast<std::byte*>(p), l.len);
      job.todo.push_back(i);
    }
  }

  static void finish(Job& job) {
    int err = job.err.load();
    if (err != 0) {
      g_failed.fetch_add(1, std::memory_order_relaxed);
      job.out.clear();
    }
    auto done = std::move(job.done);
    done(err, std::move(job.out));
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> jobs_;
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: its threads outlive static destruction
  return *p;
}

}  // namespace

void pull_async(pid_t pid, const std::vector<wire::LentPart>& lent,
                std::shared_ptr<const std::atomic<bool>> cancel, PullDone done,
                std::vector<Buffer> ready) {
  g_started.fetch_add(1, std::memory_order_relaxed);
  auto job = std::make_shared<Job>();
  job->pid = pid;
  job->cancel = std::move(cancel);
  job->lent = lent;
  job->done = std::move(done);
  if (ready.size() == lent.size()) job->out = std::move(ready);
  pool().add(std::move(job));
}

void start_pullers() { (void)pool(); }

int probe_peer(pid_t pid, uint64_t addr, uint64_t value) {
  uint64_t got = 0;
  int e = read_peer(pid, reinterpret_cast<std::byte*>(&got), addr, sizeof got);
  if (e != 0) return e;
  return got == value ? 0 : EIO;
}

PullCounts pull_counts() {
  return {g_started.load(std::memory_order_relaxed), g_failed.load(std::memory_order_relaxed)};
}

}  // namespace podium::channel::internal
