// podium-bench-core: the C++ core's latency and throughput against this machine's floor.
//
//   podium bench core [--json] [--iters N] [--messages M]
//
// Every figure comes from the same run:
//   raw_uds_rtt_us   median round trip of a 64-byte ping-pong over a Unix socketpair between
//                    two processes (blocking read/write): the floor for anything on one host.
//   raw_uds_poll_rtt_us  the same ping-pong with both ends polling (non-blocking reads in a
//                    loop): the floor for a runtime that polls, as podium's runners and waiting
//                    callers do for PODIUM_POLL_US after activity (docs/benchmarks.md).
//   actor_rtt_us     median round trip of call_one() to a C++ actor in another process.
//   inproc_rtt_us    the same, with the actor in the caller's own process.
//   pipelined_per_s  one-way messages per second to one actor in another process (a stream of
//                    broadcasts, timed until a final call confirms all were handled).
// Each latency also has its p99, and actor_vs_raw is actor_rtt_us / raw_uds_rtt_us.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "podium/mesh/actor_mesh.h"

namespace {

using Clock = std::chrono::steady_clock;

class Echo : public podium::Actor {
 public:
  Echo() = default;
  int ping(int x) { return x; }
  void sink(int x) { sum_ += x; ++count_; }
  int64_t count() { return count_; }
  PODIUM_ENDPOINTS(Echo, ping, sink, count)

 private:
  int64_t sum_ = 0;
  int64_t count_ = 0;
};
PODIUM_ACTOR(Echo)

struct Stats {
  double median_us = 0;
  double p99_us = 0;
};

Stats stats_of(std::vector<double>& us) {
  std::sort(us.begin(), us.end());
  return Stats{us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)]};
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "podium-bench-core: %s\n", what.c_str());
  std::exit(1);
}

template <class T>
T must(podium::Result<T> r, const char* what) {
  if (!r) die(std::string(what) + ": " + r.error().to_string());
  return std::move(*r);
}

// Reads exactly kSize bytes; with `poll`, spins on non-blocking reads instead of sleeping.
bool read_full(int fd, char* buf, size_t size, bool poll) {
  size_t got = 0;
  while (got < size) {
    ssize_t n = ::recv(fd, buf + got, size - got, poll ? MSG_DONTWAIT : 0);
    if (n < 0 && poll && errno == EAGAIN) continue;
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return true;
}

Stats raw_uds_rtt(int iters, bool poll) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) die("socketpair failed");
  constexpr size_t kSize = 64;
  pid_t child = ::fork();
  if (child == 0) {
    ::close(sv[0]);
    char buf[kSize];
    while (true) {
      if (!read_full(sv[1], buf, kSize, poll)) ::_exit(0);
      if (::write(sv[1], buf, kSize) != static_cast<ssize_t>(kSize)) ::_exit(1);
    }
  }
  ::close(sv[1]);
  char buf[kSize];
  std::memset(buf, 7, sizeof buf);
  std::vector<double> us;
  us.reserve(iters);
  for (int i = 0; i < iters + iters / 10; ++i) {
    auto t0 = Clock::now();
    if (::write(sv[0], buf, kSize) != static_cast<ssize_t>(kSize)) die("write failed");
    if (!read_full(sv[0], buf, kSize, poll)) die("read failed");
    if (i >= iters / 10) us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  ::close(sv[0]);
  ::waitpid(child, nullptr, 0);
  return stats_of(us);
}

Stats actor_rtt(const podium::ActorMesh<Echo>& echo, int iters) {
  std::vector<double> us;
  us.reserve(iters);
  for (int i = 0; i < iters + iters / 10; ++i) {
    auto t0 = Clock::now();
    // An untimed get(), as users write it; a dead proc still fails it at once (ME-2).
    const auto& r = echo.call_one(&Echo::ping, i).get();
    if (!r || *r != i) die("ping failed: " + (r ? std::string("wrong value") : r.error().to_string()));
    if (i >= iters / 10) us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return stats_of(us);
}

double pipelined(const podium::ActorMesh<Echo>& echo, int messages) {
  auto before = must(echo.call_one(&Echo::count).get(std::chrono::seconds(10)), "count");
  auto t0 = Clock::now();
  for (int i = 0; i < messages; ++i) {
    if (!echo.broadcast(&Echo::sink, i)) die("broadcast failed");
  }
  auto after = must(echo.call_one(&Echo::count).get(std::chrono::seconds(60)), "count");
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (after - before != messages) die("pipelined messages were lost");
  return messages / secs;
}

}  // namespace

int main(int argc, char** argv) {
  podium::init(argc, argv);
  bool json = false;
  int iters = 20000;
  int messages = 500000;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::max(100, std::atoi(argv[++i]));
    } else if (a == "--messages" && i + 1 < argc) {
      messages = std::max(1000, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: podium bench core [--json] [--iters N] [--messages M]\n");
      return 2;
    }
  }

  Stats raw = raw_uds_rtt(iters, false);
  Stats raw_poll = raw_uds_rtt(iters, true);

  auto procs = must(podium::this_host().spawn_procs({{"procs", 1}}), "spawn_procs");
  auto remote = must(procs.spawn<Echo>("echo"), "spawn");
  if (auto st = remote.initialized().get(std::chrono::seconds(10)); !st) die(st.error().to_string());
  Stats actor = actor_rtt(remote, iters);
  double per_s = pipelined(remote, messages);

  auto local = must(podium::this_proc().spawn<Echo>("local_echo"), "spawn local");
  if (auto st = local.initialized().get(std::chrono::seconds(10)); !st) die(st.error().to_string());
  Stats inproc = actor_rtt(local, iters);

  (void)procs.stop().get(std::chrono::seconds(10));

  if (json) {
    std::printf(
        "{\"raw_uds_rtt_us\": %.2f, \"raw_uds_rtt_p99_us\": %.2f, \"raw_uds_poll_rtt_us\": %.2f, "
        "\"actor_rtt_us\": %.2f, "
        "\"actor_rtt_p99_us\": %.2f, \"inproc_rtt_us\": %.2f, \"inproc_rtt_p99_us\": %.2f, "
        "\"pipelined_per_s\": %.0f, \"actor_vs_raw\": %.2f, \"iters\": %d, \"messages\": %d}\n",
        raw.median_us, raw.p99_us, raw_poll.median_us, actor.median_us, actor.p99_us, inproc.median_us,
        inproc.p99_us, per_s, actor.median_us / raw.median_us, iters, messages);
  } else {
    std::printf("raw unix socketpair rtt  median %8.2f us   p99 %8.2f us\n", raw.median_us, raw.p99_us);
    std::printf("raw rtt, both ends poll  median %8.2f us\n", raw_poll.median_us);
    std::printf("actor rtt (other proc)   median %8.2f us   p99 %8.2f us   (%.2fx raw)\n",
                actor.median_us, actor.p99_us, actor.median_us / raw.median_us);
    std::printf("actor rtt (same proc)    median %8.2f us   p99 %8.2f us\n", inproc.median_us,
                inproc.p99_us);
    std::printf("pipelined one-way        %10.0f messages/s\n", per_s);
  }
  podium::shutdown();
  return 0;
}
