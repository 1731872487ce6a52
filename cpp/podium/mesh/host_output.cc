#include "podium/mesh/host_output.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <string_view>

#include "podium/base/write_all.h"
#include "podium/host/stdio_gate.h"

namespace podium::mesh {

OutputWriter::OutputWriter() : thread_([this] { main(); }) {}

OutputWriter::~OutputWriter() { stop(); }

void OutputWriter::write(int fd, std::string data) {
  {
    std::lock_guard lock(mu_);
    if (stopping_ || queued_bytes_ + data.size() > kMaxQueuedBytes) {
      dropped_bytes_ += data.size();
      dropped_unreported_ += data.size();
      return;
    }
    queued_bytes_ += data.size();
    queue_.emplace_back(fd, std::move(data));
  }
  cv_.notify_one();
}

uint64_t OutputWriter::dropped_bytes() const {
  std::lock_guard lock(mu_);
  return dropped_bytes_;
}

namespace {

// Writes `data` to `fd` in pieces a pipe with room takes without blocking (at most 4096
// bytes once poll() says it is writable); gives up after `patience` without progress once
// `stopping` is set, so that stop() is bounded even when nobody reads `fd`.
bool write_patiently(int fd, std::string_view data, const bool& stopping, std::mutex& mu) {
  constexpr size_t kPiece = 4096;
  int idle_ms = 0;
  while (!data.empty()) {
    pollfd p{fd, POLLOUT, 0};
    int r = ::poll(&p, 1, 100);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || (r > 0 && (p.revents & (POLLERR | POLLNVAL)))) return true;  // fd broken
    if (r == 0) {
      idle_ms += 100;
      bool give_up;
      {
        std::lock_guard lock(mu);
        give_up = stopping && idle_ms >= 1000;
      }
      if (give_up) return false;
      continue;
    }
    idle_ms = 0;
    ssize_t n = ::write(fd, data.data(), std::min(kPiece, data.size()));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return true;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

void report_dropped(uint64_t n) {
  std::string line = "podium: " + std::to_string(n) +
                     " bytes of proc output dropped (stdout is not being read fast enough)\n";
  (void)write_all(2, line);
}
}  // namespace

void OutputWriter::main() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, all written
    auto [fd, data] = std::move(queue_.front());
    queue_.pop_front();
    queued_bytes_ -= data.size();
    uint64_t dropped = std::exchange(dropped_unreported_, 0);
    lock.unlock();
    if (dropped) report_dropped(dropped);
    // This process's own fds: never inside a line the process is writing (SG-1); the gate
    // takes lines it holds (written later, so `written`).
    bool written = true;
    host::StdioGate::instance().write_lines(fd, data, [&](int f, std::string_view d) {
      written = write_patiently(f, d, stopping_, mu_);
    });
    lock.lock();
    if (!written) {
      // Stopping, and nobody reads: what is left is dropped (and reported by stop()).
      dropped_bytes_ += data.size();
      dropped_unreported_ += data.size();
      for (auto& [f, d] : queue_) {
        dropped_bytes_ += d.size();
        dropped_unreported_ += d.size();
      }
      queue_.clear();
      queued_bytes_ = 0;
      return;
    }
  }
}

void OutputWriter::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
  uint64_t dropped = 0;
  {
    std::lock_guard lock(mu_);
    dropped = std::exchange(dropped_unreported_, 0);
  }
  if (dropped) report_dropped(dropped);
}

}  // namespace podium::mesh
