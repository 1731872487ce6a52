// podium::host::OutputPumps — the host side of a proc's stdout and stderr: the proc's fds 1
// and 2 (and a third, "log only" fd) are pipes whose read ends the spawning process holds;
// a pump drains them into the proc's log file and on to where the output went before (the
// terminal, a host agent's forwarding, ...).
//
// Why outside the proc: whatever reaches fd 1 or 2 (print, C code, a subprocess, a fault
// handler's backtrace) is in a kernel pipe the moment write(2) returns, and the kernel keeps
// it there when the writer dies (SIGKILL, segfault, _exit right after the write). The pump
// reads it to end-of-file, so a crashing proc's last lines reach its log file.
//
// Lines: what a pipe yields is cut into lines; only whole lines go to the file and to the
// sink, so the stdout and stderr of one proc (two pipes, one file) and the lines of different
// procs (one terminal) never mix within a line. A line longer than kMaxLine goes in pieces;
// at end-of-file a last line without '\n' gets one.
//
// The log file (LogFile): opened with O_APPEND, capped: a write that would take it past
// max_bytes first renames it to `<path>.1` (replacing the one before) and starts a new one,
// so a proc keeps at most about twice the cap. Readers take flock(LOCK_SH) on the file: a
// pump holds LOCK_EX from before it reads a pipe until what it read is in the file, so a
// reader that has seen a proc's pipes empty (FIONREAD) and then gets the lock finds every
// byte written to them before in the file (OP-3).
//
// Threads: OutputPumps runs every pump on one thread of its own (an asio io_context), so a
// slow file or sink never stalls the caller's event loop; the sink and on_done run on that
// thread and must not call stop(). add() and stop() are thread-safe.
// Locks: Impl::mu_ (the count of live pumps) is a leaf; the flock on a log file is held only
// on the pump thread, across one pipe read and its file write.
// Invariants (tests name them):
//   OP-1 Every byte written to a pumped pipe before its last writer closed it (or died) is
//        appended to the log file, and (stdout/stderr) passed to the sink, exactly once and
//        in order, including when the writer was SIGKILLed right after writing.
//   OP-2 A pump ends at end-of-file of all its pipes (every writer gone: the proc and what
//        inherited its fds); its on_done runs then, once, after the last byte was written.
//        stop() drains what the pipes hold at once and ends every pump, bounded by its grace.
//   OP-3 The log file never grows past max_bytes (rotation to `.1`), and a write to it is
//        made under LOCK_EX held since the bytes were read from the pipe.
//   OP-4 A writer faster than the file is slowed (the pipe fills, its write blocks), never
//        dropped.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "podium/base/error.h"
#include "podium/base/unique_fd.h"

namespace podium::host {

// A capped, rotated append-only file (OP-3). Not thread-safe: one pump owns it.
class LogFile {
 public:
  static constexpr uint64_t kDefaultMaxBytes = 64ull << 20;
  static constexpr uint64_t kMinMaxBytes = 1024;

  // Creates the directory (0700) and opens `path` (0600, O_APPEND).
  [[nodiscard]] static Result<std::unique_ptr<LogFile>> open(std::string path,
                                                            uint64_t max_bytes);
  // LOCK_EX on the current file (held until unlock(); rotation keeps it held).
  void lock();
  void unlock();
  // Appends `data` (whole lines), rotating first when it would pass the cap. Errors are
  // returned; the caller reports them.
  [[nodiscard]] Status append(std::string_view data);
  const std::string& path() const { return path_; }

 private:
  LogFile(std::string path, uint64_t max_bytes, UniqueFd fd, uint64_t size)
      : path_(std::move(path)), max_(max_bytes), fd_(std::move(fd)), size_(size) {}
  Status rotate();

  std::string path_;
  uint64_t max_;
  UniqueFd fd_;
  uint64_t size_;
  bool locked_ = false;
};

// Where a proc's log files go: $PODIUM_LOG_DIR, else <$TMPDIR or /tmp>/podium-logs-<uid>
// (the same rule as the Python side's proc_log.log_dir()). `env_override` (a proc's own
// PODIUM_LOG_DIR, when its spawn sets one) wins.
std::string proc_log_dir(std::string_view env_override = {});
// <dir>/proc-<pid>.log
std::string proc_log_path(std::string_view dir, pid_t pid);
// $PODIUM_PROC_LOG_MAX_BYTES (at least kMinMaxBytes), else kDefaultMaxBytes.
uint64_t proc_log_max_bytes();

// The three read ends of one proc's output pipes.
struct ProcPipes {
  UniqueFd out;  // the proc's fd 1
  UniqueFd err;  // the proc's fd 2
  UniqueFd log;  // lines for the log file only (the proc's PODIUM_PROC_LOG_FD)
};

// The write ends, to give the child (as fds 1, 2 and kProcLogFd).
struct ProcPipeEnds {
  ProcPipes read;
  UniqueFd out_w, err_w, log_w;
};

// The fd a proc finds its log-only pipe on, named by PODIUM_PROC_LOG_FD.
inline constexpr int kProcLogFd = 3;
inline constexpr const char* kProcLogFdEnv = "PODIUM_PROC_LOG_FD";

// Three pipes, close-on-exec, read ends non-blocking.
[[nodiscard]] Result<ProcPipeEnds> make_proc_pipes();

class OutputPumps {
 public:
  static constexpr size_t kMaxLine = 64 * 1024;
  // stream is 1 (stdout) or 2 (stderr); data is one or more whole lines.
  using Sink = std::function<void(int stream, std::string_view data)>;

  OutputPumps();
  ~OutputPumps();
  OutputPumps(const OutputPumps&) = delete;
  OutputPumps& operator=(const OutputPumps&) = delete;

  // Pumps `pipes` into `file` (may be null: the sink only) and `sink` (may be empty: the
  // file only) until end-of-file (OP-2); `on_done` then runs on the pump thread. `name`
  // names the proc in reports. After stop(): the pipes are drained at once, then closed.
  void add(std::string name, ProcPipes pipes, std::unique_ptr<LogFile> file, Sink sink,
           std::function<void()> on_done = {});
  // Waits up to `grace` for every pump to reach end-of-file, then drains what the pipes hold
  // and ends the rest (OP-2); joins the thread. Idempotent.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(1000));
  // Pumps not yet ended (tests).
  size_t active() const;

  class Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace podium::host
