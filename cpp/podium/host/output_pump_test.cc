#include "podium/host/output_pump.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "podium/host/exit_status.h"
#include "podium/host/spawn.h"

namespace podium::host {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/podium-pump-test-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// What a pump handed its sink, and whether it has ended.
struct Seen {
  std::mutex mu;
  std::condition_variable cv;
  std::string out, err;
  bool done = false;
  int done_count = 0;

  OutputPumps::Sink sink(std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
    return [this, delay](int stream, std::string_view data) {
      if (delay.count()) std::this_thread::sleep_for(delay);
      std::lock_guard l(mu);
      (stream == 1 ? out : err).append(data);
    };
  }
  std::function<void()> on_done() {
    return [this] {
      std::lock_guard l(mu);
      done = true;
      ++done_count;
      cv.notify_all();
    };
  }
  bool wait_done(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    std::unique_lock l(mu);
    return cv.wait_for(l, timeout, [&] { return done; });
  }
};

// Starts `sh -c script` with the pipes as its fds 1, 2 and 3; the write ends are closed here.
pid_t start_shell(const std::string& script, ProcPipeEnds& ends) {
  ChildSpec spec;
  spec.path = "/bin/sh";
  spec.argv = {"sh", "-c", script};
  spec.fds = {{ends.out_w.get(), 1}, {ends.err_w.get(), 2}, {ends.log_w.get(), kProcLogFd}};
  auto child = spawn_process(spec);
  EXPECT_TRUE(child.has_value()) << child.error().to_string();
  ends.out_w.reset();
  ends.err_w.reset();
  ends.log_w.reset();
  return child ? child->pid : -1;
}

ExitStatus reap(pid_t pid) {
  siginfo_t info{};
  ::waitid(P_PID, pid, &info, WEXITED);
  return ExitStatus::from_siginfo(info);
}

// OP-1: a child that writes, then SIGKILLs itself: every byte is in the file, the last line
// (without '\n') gets one; stdout and stderr reach the sink, the log-only pipe does not.
TEST(OutputPumpTest, EveryByteOfAChildKilledRightAfterWritingIsInTheFile) {
  TempDir dir;
  auto ends = make_proc_pipes();
  ASSERT_TRUE(ends.has_value());
  pid_t pid = start_shell(
      "printf 'out one\\nout two\\n'; printf 'err one\\n' >&2; printf 'only in the file\\n' >&3;"
      " printf 'the last words'; kill -9 $$",
      *ends);
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(reap(pid).signaled);  // dead before the pump even started
  auto file = LogFile::open(proc_log_path(dir.path(), pid), LogFile::kDefaultMaxBytes);
  ASSERT_TRUE(file.has_value());
  OutputPumps pumps;
  Seen seen;
  pumps.add("test", std::move(ends->read), std::move(*file), seen.sink(), seen.on_done());
  ASSERT_TRUE(seen.wait_done());
  std::string text = slurp(proc_log_path(dir.path(), pid));
  for (const char* line : {"out one\n", "out two\n", "err one\n", "only in the file\n",
                           "the last words\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << " not in " << text;
  }
  EXPECT_LT(text.find("out one\n"), text.find("out two\n"));
  std::lock_guard l(seen.mu);
  EXPECT_EQ(seen.out, "out one\nout two\nthe last words\n");
  EXPECT_EQ(seen.err, "err one\n");
  EXPECT_EQ(pumps.active(), 0u);
}

// OP-2: the pump ends at end-of-file of every pipe: a descendant that inherited fd 1 and
// outlives the child is still pumped, and on_done runs once, after its last line.
TEST(OutputPumpTest, EndsAtEndOfFileAfterEveryWriterIsGone) {
  TempDir dir;
  auto ends = make_proc_pipes();
  ASSERT_TRUE(ends.has_value());
  pid_t pid = start_shell("(sleep 0.3; echo from the grandchild) & echo from the child", *ends);
  ASSERT_GT(pid, 0);
  auto file = LogFile::open(proc_log_path(dir.path(), pid), LogFile::kDefaultMaxBytes);
  ASSERT_TRUE(file.has_value());
  OutputPumps pumps;
  Seen seen;
  pumps.add("test", std::move(ends->read), std::move(*file), seen.sink(), seen.on_done());
  EXPECT_EQ(reap(pid).code, 0);
  ASSERT_TRUE(seen.wait_done());
  EXPECT_EQ(slurp(proc_log_path(dir.path(), pid)), "from the child\nfrom the grandchild\n");
  std::lock_guard l(seen.mu);
  EXPECT_EQ(seen.done_count, 1);
}

// OP-4: a child writing much faster than the sink takes it loses nothing: 4 MiB of numbered
// lines, in order, in the file and at the sink.
TEST(OutputPumpTest, AWriterFasterThanTheSinkIsSlowedNotDropped) {
  TempDir dir;
  auto ends = make_proc_pipes();
  ASSERT_TRUE(ends.has_value());
  const int kLines = 40000;  // ~4 MiB with the padding below
  pid_t pid = start_shell("i=0; while [ $i -lt " + std::to_string(kLines) +
                              " ]; do printf '%08d %090d\\n' $i 0; i=$((i+1)); done",
                          *ends);
  ASSERT_GT(pid, 0);
  auto file = LogFile::open(proc_log_path(dir.path(), pid), LogFile::kDefaultMaxBytes);
  ASSERT_TRUE(file.has_value());
  OutputPumps pumps;
  Seen seen;
  pumps.add("test", std::move(ends->read), std::move(*file),
            seen.sink(std::chrono::milliseconds(2)), seen.on_done());
  EXPECT_EQ(reap(pid).code, 0);
  ASSERT_TRUE(seen.wait_done(std::chrono::seconds(120)));
  std::string text = slurp(proc_log_path(dir.path(), pid));
  std::lock_guard l(seen.mu);
  EXPECT_EQ(text, seen.out);
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ASSERT_EQ(std::stoi(line.substr(0, 8)), n) << "line " << n;
    ASSERT_EQ(line.size(), 99u);
    ++n;
  }
  EXPECT_EQ(n, kLines);
}

// OP-3: the file never passes its cap; at the cap it becomes .1 and a new one starts; the
// two together end with the last lines written, whole.
TEST(OutputPumpTest, TheFileIsCappedAndRotated) {
  TempDir dir;
  auto ends = make_proc_pipes();
  ASSERT_TRUE(ends.has_value());
  pid_t pid = start_shell(
      "i=0; while [ $i -lt 400 ]; do printf 'line %05d xxxxxxxxxxxxxxxxxxxxxxxxxxx\\n' $i; "
      "i=$((i+1)); done",
      *ends);
  ASSERT_GT(pid, 0);
  const uint64_t cap = 4096;
  std::string path = proc_log_path(dir.path(), pid);
  auto file = LogFile::open(path, cap);
  ASSERT_TRUE(file.has_value());
  OutputPumps pumps;
  Seen seen;
  pumps.add("test", std::move(ends->read), std::move(*file), {}, seen.on_done());
  EXPECT_EQ(reap(pid).code, 0);
  ASSERT_TRUE(seen.wait_done());
  EXPECT_LE(fs::file_size(path), cap);
  EXPECT_LE(fs::file_size(path + ".1"), cap);
  EXPECT_FALSE(fs::exists(path + ".2"));
  std::string both = slurp(path + ".1") + slurp(path);
  std::istringstream in(both);
  std::string line;
  std::vector<int> numbers;
  while (std::getline(in, line)) {
    ASSERT_EQ(line.rfind("line ", 0), 0u) << line;
    numbers.push_back(std::stoi(line.substr(5, 5)));
  }
  ASSERT_FALSE(numbers.empty());
  EXPECT_EQ(numbers.back(), 399);
  for (size_t i = 1; i < numbers.size(); ++i) EXPECT_EQ(numbers[i], numbers[i - 1] + 1);
}

// OP-2: stop() does not wait for a writer that never closes: it drains what the pipes hold
// within its grace and ends the pump.
TEST(OutputPumpTest, StopDrainsWhatThePipesHoldAndEnds) {
  TempDir dir;
  auto ends = make_proc_pipes();
  ASSERT_TRUE(ends.has_value());
  pid_t pid = start_shell("echo before the stop; exec sleep 60", *ends);
  ASSERT_GT(pid, 0);
  std::string path = proc_log_path(dir.path(), pid);
  auto file = LogFile::open(path, LogFile::kDefaultMaxBytes);
  ASSERT_TRUE(file.has_value());
  auto pumps = std::make_unique<OutputPumps>();
  Seen seen;
  pumps->add("test", std::move(ends->read), std::move(*file), seen.sink(), seen.on_done());
  pumps->stop(std::chrono::milliseconds(200));
  EXPECT_TRUE(seen.wait_done(std::chrono::milliseconds(0)));
  EXPECT_EQ(slurp(path), "before the stop\n");
  ::kill(pid, SIGKILL);
  reap(pid);
}

// OP-3: a reader that takes LOCK_SH after the proc's pipe is empty finds what was written.
TEST(OutputPumpTest, AReaderWithTheLockAfterTheDrainFindsEveryLine) {
  TempDir dir;
  auto ends = make_proc_pipes();
  ASSERT_TRUE(ends.has_value());
  int w = ends->out_w.get();
  std::string path = proc_log_path(dir.path(), ::getpid());
  auto file = LogFile::open(path, LogFile::kDefaultMaxBytes);
  ASSERT_TRUE(file.has_value());
  OutputPumps pumps;
  Seen seen;
  pumps.add("test", std::move(ends->read), std::move(*file), {}, seen.on_done());
  for (int i = 0; i < 200; ++i) {
    std::string line = "line " + std::to_string(i) + "\n";
    ASSERT_EQ(::write(w, line.data(), line.size()), static_cast<ssize_t>(line.size()));
    int pending = 1;
    for (int spin = 0; spin < 100000 && pending > 0; ++spin) {
      ASSERT_EQ(::ioctl(w, FIONREAD, &pending), 0);
      if (pending > 0) std::this_thread::yield();
    }
    ASSERT_EQ(pending, 0);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_SH), 0);
    std::string text = slurp(path);
    ::close(fd);
    ASSERT_NE(text.find(line), std::string::npos) << line;
  }
  ends->out_w.reset();
  ends->err_w.reset();
  ends->log_w.reset();
  ASSERT_TRUE(seen.wait_done());
}

}  // namespace
}  // namespace podium::host
