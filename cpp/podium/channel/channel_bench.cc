// channel_bench: figures for the channel hot path between two processes, next to the
// machine's own limit measured in the same run (a raw Unix socketpair ping-pong).
//
//   channel_bench [round_trips=20000] [one_way=1000000] [runs=3]
//
// Prints: raw socketpair round trip, Net round trip over Unix sockets (each side's
// DeliverFn sends the reply from its io thread), and one-way Net throughput of small
// envelopes (sender sends as fast as it can; the receiver replies once all arrived), with
// the CPU time each process spends per envelope: on a shared machine the wall-clock figures
// drift with load, the CPU cost much less.
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "podium/channel/net.h"

namespace {

using podium::channel::Address;
using podium::channel::Net;
using Clock = std::chrono::steady_clock;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double raw_socketpair_round_trip(int n) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) std::abort();
  char buf[64] = {};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(sv[0]);
    for (int i = 0; i < n; ++i) {
      if (::read(sv[1], buf, sizeof buf) != sizeof buf) break;
      if (::write(sv[1], buf, sizeof buf) != sizeof buf) break;
    }
    ::_exit(0);
  }
  ::close(sv[1]);
  auto start = Clock::now();
  for (int i = 0; i < n; ++i) {
    if (::write(sv[0], buf, sizeof buf) != sizeof buf) std::abort();
    if (::read(sv[0], buf, sizeof buf) != sizeof buf) std::abort();
  }
  auto elapsed = Clock::now() - start;
  ::close(sv[0]);
  ::waitpid(pid, nullptr, 0);
  return micros(elapsed) / n;
}

podium::wire::Envelope small_envelope(size_t bytes) {
  podium::wire::Envelope e;
  e.kind = 1;
  e.dest = "unix:/tmp/x.sock,proc[1].actor[0].port[3]";
  e.sender = "unix:/tmp/y.sock,proc[0].client[0]";
  e.parts.push_back(podium::Buffer::copy_of(std::string(bytes, 'p')));
  return e;
}

// One process's side: a Net on its own io_context run by one thread.
struct Side {
  explicit Side(podium::channel::DeliverFn deliver)
      : work(io.get_executor()),
        net(io, podium::channel::Config{}, std::move(deliver),
            [](podium::wire::Envelope&&, podium::Error e) {
              std::fprintf(stderr, "undeliverable: %s\n", e.to_string().c_str());
            }),
        thread([this] { io.run(); }) {}
  ~Side() {
    net.stop();
    work.reset();
    io.stop();
    thread.join();
  }
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work;
  Net net;
  std::thread thread;
};

// Runs `child` in a forked process (which returns when it is done) and `parent` here.
template <class Child, class Parent>
void in_two_processes(Child child, Parent parent) {
  pid_t pid = ::fork();
  if (pid == 0) {
    child();
    ::_exit(0);
  }
  parent();
  ::waitpid(pid, nullptr, 0);
}

struct Latch {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  void set() {
    std::lock_guard lock(mu);
    done = true;
    cv.notify_all();
  }
  void wait() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done; });
  }
};

void wait_for_socket(const std::string& path) {
  while (!std::filesystem::exists(path)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

double net_round_trip(const std::string& dir, int n) {
  Address a = *Address::parse("unix:" + dir + "/a.sock");
  Address b = *Address::parse("unix:" + dir + "/b.sock");
  double result = 0;
  in_two_processes(
      [&] {
        Latch quit;
        int seen = 0;
        Side* self = nullptr;
        Side side([&](podium::wire::Envelope&& e) {
          self->net.send(a, std::move(e));
          if (++seen == n) quit.set();
        });
        self = &side;
        (void)side.net.listen(b);
        quit.wait();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // last acks
      },
      [&] {
        Latch done;
        int seen = 0;
        Side* self = nullptr;
        Side side([&](podium::wire::Envelope&& e) {
          if (++seen == n) {
            done.set();
          } else {
            self->net.send(b, std::move(e));
          }
        });
        self = &side;
        (void)side.net.listen(a);
        wait_for_socket(b.target);
        // Warm the links up (connect, first allocations) before timing.
        auto start = Clock::now();
        side.net.send(b, small_envelope(64));
        done.wait();
        result = micros(Clock::now() - start) / n;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      });
  std::filesystem::remove(a.target);
  std::filesystem::remove(b.target);
  return result;
}

double cpu_seconds() {
  rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  auto sec = [](timeval t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

struct OneWay {
  double rate = 0;          // envelopes per second, wall clock
  double sender_cpu = 0;    // CPU seconds per envelope, whole sending process
  double receiver_cpu = 0;  // CPU seconds per envelope, whole receiving process
};

OneWay net_one_way(const std::string& dir, int n) {
  Address a = *Address::parse("unix:" + dir + "/a1.sock");
  Address b = *Address::parse("unix:" + dir + "/b1.sock");
  OneWay r;
  int report[2];
  if (::pipe(report) != 0) std::abort();
  in_two_processes(
      [&] {
        Latch quit;
        int seen = 0;
        double cpu0 = 0, cpu1 = 0;
        Side* self = nullptr;
        Side side([&](podium::wire::Envelope&& e) {
          if (++seen == 1) cpu0 = cpu_seconds();
          if (seen == n) {
            cpu1 = cpu_seconds();
            self->net.send(a, std::move(e));
            quit.set();
          }
        });
        self = &side;
        (void)side.net.listen(b);
        quit.wait();
        double per = (cpu1 - cpu0) / n;
        if (::write(report[1], &per, sizeof per) != sizeof per) std::abort();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      },
      [&] {
        Latch done;
        Side side([&](podium::wire::Envelope&&) { done.set(); });
        (void)side.net.listen(a);
        wait_for_socket(b.target);
        double cpu0 = cpu_seconds();
        auto start = Clock::now();
        for (int i = 0; i < n; ++i) side.net.send(b, small_envelope(32));
        done.wait();
        r.rate = n / std::chrono::duration<double>(Clock::now() - start).count();
        r.sender_cpu = (cpu_seconds() - cpu0) / n;
        if (::read(report[0], &r.receiver_cpu, sizeof r.receiver_cpu) != sizeof r.receiver_cpu) {
          std::abort();
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      });
  ::close(report[0]);
  ::close(report[1]);
  std::filesystem::remove(a.target);
  std::filesystem::remove(b.target);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int round_trips = argc > 1 ? std::atoi(argv[1]) : 20000;
  int one_way = argc > 2 ? std::atoi(argv[2]) : 1000000;
  int runs = argc > 3 ? std::atoi(argv[3]) : 3;
  char tmpl[] = "/tmp/podium-bench-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  // Best of `runs`, interleaved, so that a burst of load elsewhere hits both sides alike.
  double raw = 1e9, net = 1e9;
  OneWay best;
  for (int i = 0; i < runs; ++i) {
    raw = std::min(raw, raw_socketpair_round_trip(round_trips));
    net = std::min(net, net_round_trip(dir, round_trips));
    OneWay w = net_one_way(dir, one_way);
    if (w.rate > best.rate) best.rate = w.rate;
    if (i == 0 || w.sender_cpu < best.sender_cpu) best.sender_cpu = w.sender_cpu;
    if (i == 0 || w.receiver_cpu < best.receiver_cpu) best.receiver_cpu = w.receiver_cpu;
  }
  std::filesystem::remove_all(dir);
  std::printf("raw socketpair round trip : %7.2f us\n", raw);
  std::printf("Net round trip, unix      : %7.2f us = %.2fx raw\n", net, net / raw);
  std::printf("Net one-way, unix         : %7.0f envelopes/s (%d envelopes, 32-byte part)\n",
              best.rate, one_way);
  std::printf("  CPU per envelope        : sender %.2f us, receiver %.2f us (whole processes)\n",
              best.sender_cpu * 1e6, best.receiver_cpu * 1e6);
  std::printf("best of %d runs\n", runs);
  return 0;
}
