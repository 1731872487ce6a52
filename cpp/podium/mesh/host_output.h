// podium::mesh::OutputWriter — writes what procs on attached hosts print (HA-6) to this
// process's stdout or stderr, from a thread of its own.
//
// A controller receives its remote procs' output as host_output messages on a runner thread
// of its root proc's loop, and a worker with no controller writes its procs' output itself.
// A write(2) to a full pipe (a stdout nobody reads) blocks; done on a loop thread it would
// stall the loop, its heartbeats with it, and the hosts would be declared lost. So the loop
// only queues, and this writer's thread writes.
//
// Threads: write() is thread-safe and never blocks; the writer thread is joined by stop().
// Locks: mu_ guards queue_, queued_bytes_, dropped_*, stopping_; a leaf lock, never held
// while writing.
// Invariants:
//   HA-12 Output queued to be written is bounded (kMaxQueuedBytes); what does not fit is
//        dropped, counted, and reported: the next line that is written is preceded by
//        "podium: N bytes of proc output dropped (stdout is not being read fast enough)" on
//        stderr, and stop() reports a count still unreported. Nothing is lost without a word,
//        and the loop never waits for a reader.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace podium::mesh {

class OutputWriter {
 public:
  static constexpr size_t kMaxQueuedBytes = 4 << 20;

  OutputWriter();
  ~OutputWriter();
  OutputWriter(const OutputWriter&) = delete;
  OutputWriter& operator=(const OutputWriter&) = delete;

  // Queues `data` for fd 1 or 2; drops it (counted) when the queue is full or stopped.
  void write(int fd, std::string data);
  // Writes what is queued (a piece that cannot be written for 1 s is given up), reports
  // drops, joins.
  void stop();
  // Bytes dropped so far (tests).
  uint64_t dropped_bytes() const;

 private:
  void main();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int, std::string>> queue_;
  size_t queued_bytes_ = 0;
  uint64_t dropped_bytes_ = 0, dropped_unreported_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace podium::mesh
