// podium::host::StdioGate — this process's own fds 1 and 2, shared by two writers: the
// process's Python (print in the controller) and the output pumps, which pass on whole lines
// that the procs it spawned wrote (ProcSpawner::emit). print("results", xs) reaches the fd as
// several writes when Python's stdout is unbuffered (PYTHONUNBUFFERED, python -u) and as
// chunks of 8 KiB when it is block-buffered; a proc line written between two of them would
// land inside the controller's line.
//
// The Python side (podium/_src/line_guard.py, wrapping sys.stdout / sys.stderr) marks an fd
// open before each write and closed after a write that ends a line (and a flush): while it is
// open the fd's content may end inside a line. write_lines() writes a proc's lines at once
// when the fd is closed, else holds them; mark(fd, false) writes what was held, after the
// line that closed it. A line left open (a prompt, a progress bar without '\n') holds proc
// lines for at most hold(): a thread of the gate's own, started at the first hold, writes
// them then, and lines go straight through until the fd closes again.
//
// Invariants (tests name them):
//   SG-1 A proc line passed to write_lines() never lands between two writes of a line of
//        this process's own that the Python side marked (open from before its first piece to
//        after its newline), unless that line stayed open for hold() or more.
//   SG-2 Every byte passed to write_lines() is written once, in the order passed per fd; a
//        held line waits at most hold() (plus scheduling) after it was held.
//
// Threads and locks: mu_ is held across the write of held or passed lines (a pipe that is
// full blocks the caller, as the fd itself would); under it only a caller's Writer runs, which
// may take a leaf lock of its own (mesh::OutputWriter's, whose patient write is bounded once
// it stops). The pumps (host/output_pump.h, through ProcSpawner::emit), the output writer of
// remote procs' lines (mesh/host_output.h) and the Python side call in; a thread of the gate's
// own writes lines held past hold(). The Python side marks through try_mark() with the GIL
// held (a GIL handed over at each print() would make it wait for a busy thread), and through
// mark() without the GIL only when the lock is taken or held lines are to be written. The singleton is never destroyed (its thread may wait at
// exit). fork() takes mu_ around the fork (pthread_atfork), and the child starts from an empty
// gate: a pump thread's lock or lines held for the parent never reach it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace podium::host {

class StdioGate {
 public:
  static constexpr std::chrono::milliseconds kDefaultHold{500};

  static StdioGate& instance();

  // How a caller writes lines it passes when they go at once (under mu_); lines held go out
  // later with a plain blocking write.
  using Writer = std::function<void(int fd, std::string_view data)>;

  // Lines for fd 1 or 2 (other fds: written at once, not gated).
  void write_lines(int fd, std::string_view data);
  void write_lines(int fd, std::string_view data, const Writer& writer);
  // The process's own writer: open before writing, closed after a write that ended a line.
  void mark(int fd, bool open);
  // mark() when it neither waits for the lock nor has held lines to write; false: nothing
  // done, call mark() (Python calls this one with the GIL held, mark() without it).
  bool try_mark(int fd, bool open);
  // For tests: how long an open line holds proc lines.
  void set_hold(std::chrono::milliseconds hold);
  std::chrono::milliseconds hold() const;

 private:
  StdioGate() = default;
  struct Fd {
    bool open = false;
    std::chrono::steady_clock::time_point since{};  // when it opened
    std::string held;
  };
  void mark_locked(int fd, bool open);
  void release_locked(int fd);
  void run_timer();
  static StdioGate* instance_unsafe();
  void reset_in_child();
  static Fd* slot(Fd (&fds)[2], int fd) { return fd == 1 || fd == 2 ? &fds[fd - 1] : nullptr; }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  Fd fds_[2];
  std::chrono::milliseconds hold_ = kDefaultHold;
  bool timer_started_ = false;
};

}  // namespace podium::host
