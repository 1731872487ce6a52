// channel_bench: figures for the channel hot path between two processes, next to the
// machine's own limit measured in the same run (a raw socket ping-pong).
//
//   channel_bench [round_trips=20000] [one_way=1000000] [runs=3] [transport=unix]
//                 [bulk_mib=256]
//
// transport: unix (Unix sockets), tcp (TCP on 127.0.0.1, no secret, no TLS) or tls (TCP on
// 127.0.0.1 with TLS 1.3 on both sides, certificates made at start: channel CH-9).
// Prints: raw round trip (a socketpair for unix; a TCP loopback connection otherwise), Net
// round trip (each side's DeliverFn sends the reply from its io thread), one-way Net
// throughput of small envelopes (the sender sends as fast as it can; the receiver replies
// once all arrived), with the CPU time each process spends per envelope (on a shared machine
// the wall-clock figures drift with load, the CPU cost much less), and one-way bulk
// throughput of 1 MiB envelopes. Each timed phase starts once the link is connected (and, for
// tls, the handshake done).
#include <netinet/in.h>
#include <netinet/tcp.h>
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
#include "podium/channel/test_certs.h"

namespace {

using podium::channel::Address;
using podium::channel::Config;
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

// The same ping-pong over a TCP loopback connection (TCP_NODELAY): the floor for tcp and tls.
double raw_tcp_round_trip(int n) {
  int l = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  if (::bind(l, reinterpret_cast<sockaddr*>(&sa), len) != 0 || ::listen(l, 1) != 0 ||
      ::getsockname(l, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    std::abort();
  }
  int one = 1;
  char buf[64] = {};
  pid_t pid = ::fork();
  if (pid == 0) {
    int c = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(c, reinterpret_cast<sockaddr*>(&sa), len) != 0) ::_exit(1);
    ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (int i = 0; i < n; ++i) {
      if (::recv(c, buf, sizeof buf, MSG_WAITALL) != sizeof buf) break;
      if (::write(c, buf, sizeof buf) != sizeof buf) break;
    }
    ::_exit(0);
  }
  int s = ::accept(l, nullptr, nullptr);
  ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  auto start = Clock::now();
  for (int i = 0; i < n; ++i) {
    if (::write(s, buf, sizeof buf) != sizeof buf) std::abort();
    if (::recv(s, buf, sizeof buf, MSG_WAITALL) != sizeof buf) std::abort();
  }
  auto elapsed = Clock::now() - start;
  ::close(s);
  ::close(l);
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

// Where the two processes listen, and how their Nets are configured.
struct Setup {
  Address a, b;
  Config config;
};

// One process's side: a Net on its own io_context run by one thread.
struct Side {
  Side(const Config& config, podium::channel::DeliverFn deliver)
      : work(io.get_executor()),
        net(io, config, std::move(deliver),
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

// Until the peer listens: a Unix socket file appears; a TCP link simply re-dials.
void wait_for_listener(const Address& a) {
  if (a.transport != podium::channel::Transport::kUnix) return;
  while (!std::filesystem::exists(a.target)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void remove_socket(const Address& a) {
  if (a.transport == podium::channel::Transport::kUnix) std::filesystem::remove(a.target);
}

// The mean round trip over n, after a first one that connects both links (its time, which
// includes two connects and, for tls, two handshakes, goes to `first_us`).
double net_round_trip(const Setup& setup, int n, double& first_us) {
  const Address& a = setup.a;
  const Address& b = setup.b;
  double result = 0;
  int ready[2];
  if (::pipe(ready) != 0) std::abort();
  in_two_processes(
      [&] {
        Latch quit;
        int seen = 0;
        Side* self = nullptr;
        Side side(setup.config, [&](podium::wire::Envelope&& e) {
          self->net.send(a, std::move(e));
          if (++seen == n + 1) quit.set();  // the warm-up one, then n
        });
        self = &side;
        (void)side.net.listen(b);
        char one = 1;
        if (::write(ready[1], &one, 1) != 1) std::abort();
        quit.wait();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // last acks
      },
      [&] {
        Latch warm, done;
        int seen = 0;
        Side* self = nullptr;
        Clock::time_point start;
        Side side(setup.config, [&](podium::wire::Envelope&& e) {
          if (++seen == 1) {
            // Both links are connected: time n round trips from here.
            start = Clock::now();
            self->net.send(b, std::move(e));
            warm.set();
          } else if (seen == n + 1) {
            done.set();
          } else {
            self->net.send(b, std::move(e));
          }
        });
        self = &side;
        (void)side.net.listen(a);
        char one;
        if (::read(ready[0], &one, 1) != 1) std::abort();  // the peer listens on b
        auto first = Clock::now();
        side.net.send(b, small_envelope(64));
        warm.wait();
        first_us = micros(start - first);
        done.wait();
        result = micros(Clock::now() - start) / n;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      });
  ::close(ready[0]);
  ::close(ready[1]);
  remove_socket(a);
  remove_socket(b);
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

// n envelopes of one `part_bytes` part each, after one that connects the links.
OneWay net_one_way(const Setup& setup, int n, size_t part_bytes) {
  const Address& a = setup.a;
  const Address& b = setup.b;
  OneWay r;
  int report[2];
  if (::pipe(report) != 0) std::abort();
  in_two_processes(
      [&] {
        Latch quit;
        int seen = 0;
        double cpu0 = 0, cpu1 = 0;
        Side* self = nullptr;
        Side side(setup.config, [&](podium::wire::Envelope&& e) {
          ++seen;
          if (seen == 1) {  // warm-up: the sender starts timing when it hears back
            self->net.send(a, std::move(e));
            cpu0 = cpu_seconds();
          } else if (seen == n + 1) {
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
        Latch warm, done;
        int seen = 0;
        Side side(setup.config, [&](podium::wire::Envelope&&) {
          if (++seen == 1) {
            warm.set();
          } else {
            done.set();
          }
        });
        (void)side.net.listen(a);
        wait_for_listener(b);
        side.net.send(b, small_envelope(32));
        warm.wait();
        podium::Buffer part =
            podium::Buffer::copy_of(std::string(part_bytes > 64 ? part_bytes : 0, 'p'));
        double cpu0 = cpu_seconds();
        auto start = Clock::now();
        for (int i = 0; i < n; ++i) {
          if (part_bytes <= 64) {  // built afresh each time, as a caller's messages are
            side.net.send(b, small_envelope(part_bytes));
            continue;
          }
          podium::wire::Envelope e = small_envelope(0);
          e.parts[0] = part;  // a bulk part shares its bytes: no copy per envelope
          side.net.send(b, std::move(e));
        }
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
  remove_socket(a);
  remove_socket(b);
  return r;
}

// Addresses for `transport`: Unix sockets in `dir`, or TCP ports on 127.0.0.1 held by
// reservations (the listeners set reuse_port) so that both are known before the fork.
Setup make_setup(const std::string& transport, const std::string& dir, const std::string& tag,
                 std::vector<podium::channel::PortReservation>& ports) {
  Setup s;
  if (transport == "unix") {
    s.a = *Address::parse("unix:" + dir + "/a" + tag + ".sock");
    s.b = *Address::parse("unix:" + dir + "/b" + tag + ".sock");
    return s;
  }
  for (Address* addr : {&s.a, &s.b}) {
    auto port = podium::channel::PortReservation::make("127.0.0.1");
    if (!port) {
      std::fprintf(stderr, "%s\n", port.error().to_string().c_str());
      std::exit(1);
    }
    *addr = *Address::parse("tcp:127.0.0.1:" + std::to_string(port->port()));
    ports.push_back(std::move(*port));
  }
  s.config.reuse_port = true;
  if (transport == "tls") {
    static const podium::channel::testing::TestCa ca("channel_bench CA");
    s.config.tls = ca.issue("channel_bench");  // both sides present it: one job, one CA
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int round_trips = argc > 1 ? std::atoi(argv[1]) : 20000;
  int one_way = argc > 2 ? std::atoi(argv[2]) : 1000000;
  int runs = argc > 3 ? std::atoi(argv[3]) : 3;
  std::string transport = argc > 4 ? argv[4] : "unix";
  int bulk_mib = argc > 5 ? std::atoi(argv[5]) : 256;
  if (transport != "unix" && transport != "tcp" && transport != "tls") {
    std::fprintf(stderr, "channel_bench: transport is unix, tcp or tls, not %s\n",
                 transport.c_str());
    return 2;
  }
  char tmpl[] = "/tmp/podium-bench-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  // Best of `runs`, interleaved, so that a burst of load elsewhere hits both sides alike.
  double raw = 1e9, net = 1e9, first = 1e9;
  OneWay best, bulk;
  for (int i = 0; i < runs; ++i) {
    std::vector<podium::channel::PortReservation> ports;
    Setup rt = make_setup(transport, dir, "", ports);
    Setup ow = make_setup(transport, dir, "1", ports);
    Setup bk = make_setup(transport, dir, "2", ports);
    raw = std::min(raw, transport == "unix" ? raw_socketpair_round_trip(round_trips)
                                            : raw_tcp_round_trip(round_trips));
    double first_us = 0;
    net = std::min(net, net_round_trip(rt, round_trips, first_us));
    first = std::min(first, first_us);
    OneWay w = net_one_way(ow, one_way, 32);
    if (w.rate > best.rate) best.rate = w.rate;
    if (i == 0 || w.sender_cpu < best.sender_cpu) best.sender_cpu = w.sender_cpu;
    if (i == 0 || w.receiver_cpu < best.receiver_cpu) best.receiver_cpu = w.receiver_cpu;
    if (bulk_mib > 0) {
      OneWay m = net_one_way(bk, bulk_mib, size_t{1} << 20);
      if (m.rate > bulk.rate) bulk.rate = m.rate;
      if (i == 0 || m.sender_cpu < bulk.sender_cpu) bulk.sender_cpu = m.sender_cpu;
      if (i == 0 || m.receiver_cpu < bulk.receiver_cpu) bulk.receiver_cpu = m.receiver_cpu;
    }
  }
  std::filesystem::remove_all(dir);
  const char* t = transport.c_str();
  std::printf("raw %-10s round trip : %7.2f us\n", transport == "unix" ? "socketpair" : "tcp", raw);
  std::printf("Net round trip, %-4s     : %7.2f us = %.2fx raw\n", t, net, net / raw);
  std::printf("  first one (connects)    : %7.0f us\n", first);
  std::printf("Net one-way, %-4s        : %7.0f envelopes/s (%d envelopes, 32-byte part)\n", t,
              best.rate, one_way);
  std::printf("  CPU per envelope        : sender %.2f us, receiver %.2f us (whole processes)\n",
              best.sender_cpu * 1e6, best.receiver_cpu * 1e6);
  if (bulk_mib > 0) {
    std::printf("Net bulk, %-4s           : %7.0f MiB/s (%d envelopes of 1 MiB)\n", t, bulk.rate,
                bulk_mib);
    std::printf("  CPU per MiB             : sender %.0f us, receiver %.0f us (whole processes)\n",
                bulk.sender_cpu * 1e6, bulk.receiver_cpu * 1e6);
  }
  std::printf("best of %d runs\n", runs);
  return 0;
}
