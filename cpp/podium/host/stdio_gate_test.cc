// StdioGate (SG-1, SG-2): fd 1 of this test is a pipe for the length of each test.
#include "podium/host/stdio_gate.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

namespace podium::host {
namespace {

using namespace std::chrono_literals;

// Points fd 1 at a pipe; read() takes what is there now; the destructor puts fd 1 back.
class CapturedStdout {
 public:
  CapturedStdout() {
    saved_ = ::dup(1);
    int p[2];
    EXPECT_EQ(::pipe2(p, O_NONBLOCK), 0);
    read_ = p[0];
    ::dup2(p[1], 1);
    ::close(p[1]);
  }
  ~CapturedStdout() {
    StdioGate::instance().mark(1, false);
    StdioGate::instance().set_hold(StdioGate::kDefaultHold);
    ::dup2(saved_, 1);
    ::close(saved_);
    ::close(read_);
  }
  std::string read() {
    std::string out;
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(read_, buf, sizeof buf);
      if (n <= 0) return out;
      out.append(buf, static_cast<size_t>(n));
    }
  }
  // Polls until what was read ends with `tail` or `bound` passed.
  std::string read_until(const std::string& tail, std::chrono::milliseconds bound) {
    std::string out;
    const auto deadline = std::chrono::steady_clock::now() + bound;
    while (std::chrono::steady_clock::now() < deadline) {
      out += read();
      if (out.size() >= tail.size() && out.compare(out.size() - tail.size(), tail.size(), tail) == 0) {
        break;
      }
      std::this_thread::sleep_for(2ms);
    }
    return out;
  }

 private:
  int saved_ = -1;
  int read_ = -1;
};

void own(int fd, std::string_view s) { ASSERT_EQ(::write(fd, s.data(), s.size()), ssize_t(s.size())); }

TEST(StdioGate, LinesGoStraightThroughWhileNoLineIsOpen) {  // SG-2
  CapturedStdout out;
  auto& gate = StdioGate::instance();
  gate.write_lines(1, "[h 1] a\n");
  own(1, "mine\n");
  gate.write_lines(1, "[h 1] b\n");
  EXPECT_EQ(out.read(), "[h 1] a\nmine\n[h 1] b\n");
}

TEST(StdioGate, AProcLineWaitsForTheOpenLineAndFollowsIt) {  // SG-1, SG-2
  CapturedStdout out;
  auto& gate = StdioGate::instance();
  gate.mark(1, true);
  own(1, "results");
  gate.write_lines(1, "[h 1] a\n");
  own(1, " [49, 49]");
  gate.write_lines(1, "[h 2] b\n");
  EXPECT_EQ(out.read(), "results [49, 49]");  // held
  own(1, "\n");
  gate.mark(1, false);
  EXPECT_EQ(out.read(), "\n[h 1] a\n[h 2] b\n");
}

TEST(StdioGate, ALineLeftOpenHoldsProcLinesNoLongerThanTheHold) {  // SG-2
  CapturedStdout out;
  auto& gate = StdioGate::instance();
  gate.set_hold(100ms);
  gate.mark(1, true);
  own(1, "prompt> ");
  const auto t0 = std::chrono::steady_clock::now();
  gate.write_lines(1, "[h 1] a\n");
  EXPECT_EQ(out.read(), "prompt> ");
  EXPECT_EQ(out.read_until("[h 1] a\n", 5s), "[h 1] a\n");
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 90ms);
  gate.write_lines(1, "[h 1] b\n");  // overdue: straight through
  EXPECT_EQ(out.read(), "[h 1] b\n");
}

TEST(StdioGate, AForkedChildStartsFromAnEmptyGate) {
  CapturedStdout out;
  auto& gate = StdioGate::instance();
  gate.mark(1, true);
  gate.write_lines(1, "[h 1] held for the parent\n");
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // not open here, nothing held: the line goes straight out
    StdioGate::instance().write_lines(1, "[h 2] child\n");
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(status, 0);
  EXPECT_EQ(out.read(), "[h 2] child\n");
  gate.mark(1, false);
  EXPECT_EQ(out.read(), "[h 1] held for the parent\n");
}

TEST(StdioGate, TryMarkLeavesTheWriteOfHeldLinesToMark) {
  CapturedStdout out;
  auto& gate = StdioGate::instance();
  EXPECT_TRUE(gate.try_mark(1, true));
  gate.write_lines(1, "[h 1] a\n");
  EXPECT_TRUE(gate.try_mark(1, true));  // still open: nothing to write
  EXPECT_FALSE(gate.try_mark(1, false));  // held lines: mark() writes them
  EXPECT_EQ(out.read(), "");
  gate.mark(1, false);
  EXPECT_EQ(out.read(), "[h 1] a\n");
  EXPECT_TRUE(gate.try_mark(1, false));
}

TEST(StdioGate, OtherFdsAreNotGated) {
  CapturedStdout out;
  int p[2];
  ASSERT_EQ(::pipe2(p, O_NONBLOCK), 0);
  StdioGate::instance().mark(1, true);
  StdioGate::instance().write_lines(p[1], "x\n");
  char buf[8] = {};
  EXPECT_EQ(::read(p[0], buf, sizeof buf), 2);
  ::close(p[0]);
  ::close(p[1]);
}

}  // namespace
}  // namespace podium::host
