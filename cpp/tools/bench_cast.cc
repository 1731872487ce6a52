// podium-bench-cast: call() on meshes of 1..256 C++ procs, through the cast tree and through
// the naive star (the controller sends to every actor itself), in the same run.
//
//   podium bench cast [--json] [--fanout K] [--sizes 1,8,64,256] [--iters N]
//
// Per size: tree_us / star_us, the median latency of call() (every rank answers); and
// controller_sends / controller_recvs, the envelopes the controller's proc sent to and received
// from other procs per tree call (Proc::traffic, AC-12), the largest over the timed calls.
// "calibration" holds the per-hop costs `podium sim cast` builds its model from
// (docs/cast.md): hop_us, half the round trip of a call to one actor in another proc;
// send_us, the controller's own time per message sent in a star cast (call_raw's return, over
// N); recv_us, the rest of the star's growth per rank (a reply's arrival and handling);
// member_us, the tree root's own time per rank (the plan it encodes).
//
// PODIUM_POLL_US defaults to 0 here (every proc sleeps in epoll_wait): 256 procs that poll
// would share 2 cores; set it to measure with polling.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "podium/actor/proc.h"
#include "podium/mesh/actor_mesh.h"
#include "podium/mesh/relay.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

class Echo : public podium::Actor {
 public:
  Echo() = default;
  int ping(int x) { return x; }
  PODIUM_ENDPOINTS(Echo, ping)
};
PODIUM_ACTOR(Echo)

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "podium-bench-cast: %s\n", what.c_str());
  podium::shutdown();
  std::exit(1);
}

template <class T>
T must(podium::Result<T> r, const char* what) {
  if (!r) die(std::string(what) + ": " + r.error().to_string());
  return std::move(*r);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

struct Mode {
  double call_us = 0;   // median call() latency
  double send_us = 0;   // median time until call_raw returned (the sender's own work)
  uint64_t sends = 0;   // most controller sends in one call
  uint64_t recvs = 0;   // most controller receives in one call
};

Mode measure(const podium::ActorMesh<Echo>& mesh, size_t fanout, int iters) {
  podium::mesh::set_cast_fanout(fanout);
  auto& proc = podium::mesh::Runtime::get().proc();
  auto arg = podium::detail::pack(std::tuple<int>(1));
  std::vector<double> lat, send;
  Mode m;
  for (int i = 0; i < iters + 3; ++i) {
    auto before = proc.traffic();
    auto t0 = Clock::now();
    auto f = mesh.call_raw("ping", {arg});
    double s = us_since(t0);
    auto r = f.get(30s);
    double l = us_since(t0);
    auto after = proc.traffic();
    if (!r) die("call: " + r.error().to_string());
    for (size_t k = 0; k < r->size(); ++k) {
      if (!(*r)[k]) die("rank " + std::to_string(k) + ": " + (*r)[k].error().to_string());
    }
    if (i < 3) continue;  // warm-up: connections, first-touch
    lat.push_back(l);
    send.push_back(s);
    m.sends = std::max(m.sends, after.sent - before.sent);
    m.recvs = std::max(m.recvs, after.received - before.received);
  }
  m.call_us = median(lat);
  m.send_us = median(send);
  return m;
}

std::vector<size_t> parse_sizes(const std::string& s) {
  std::vector<size_t> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(std::strtoull(s.substr(start, comma - start).c_str(), nullptr, 10));
    start = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  ::setenv("PODIUM_POLL_US", "0", 0);  // before init: the controller and its procs
  podium::init(argc, argv);
  bool json = false;
  size_t fanout = podium::mesh::kDefaultCastFanout;
  std::vector<size_t> sizes = {1, 8, 64, 256};
  int iters = 30;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--fanout" && i + 1 < argc) {
      fanout = std::max<size_t>(2, std::strtoull(argv[++i], nullptr, 10));
    } else if (a == "--sizes" && i + 1 < argc) {
      sizes = parse_sizes(argv[++i]);
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::max(5, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr,
                   "usage: podium bench cast [--json] [--fanout K] [--sizes 1,8,64,256] "
                   "[--iters N]\n");
      return 2;
    }
  }
  if (sizes.empty()) die("no sizes");

  struct Row {
    size_t procs;
    Mode tree, star;
  };
  std::vector<Row> rows;
  double hop_us = 0;
  for (size_t n : sizes) {
    auto t0 = Clock::now();
    auto procs = must(podium::this_host().spawn_procs({{"procs", n}}), "spawn_procs");
    if (auto st = procs.initialized().get(120s); !st) die("procs: " + st.error().to_string());
    auto echo = must(procs.spawn<Echo>("echo"), "spawn");
    if (auto st = echo.initialized().get(120s); !st) die("actors: " + st.error().to_string());
    double spawn_ms = us_since(t0) / 1000;
    Row row{n, {}, {}};
    // Alternate so that drift on a shared machine hits both alike.
    Mode t1 = measure(echo, fanout, iters / 2);
    Mode s1 = measure(echo, 0, iters / 2);
    Mode t2 = measure(echo, fanout, iters - iters / 2);
    Mode s2 = measure(echo, 0, iters - iters / 2);
    row.tree = Mode{(t1.call_us + t2.call_us) / 2, (t1.send_us + t2.send_us) / 2,
                    std::max(t1.sends, t2.sends), std::max(t1.recvs, t2.recvs)};
    row.star = Mode{(s1.call_us + s2.call_us) / 2, (s1.send_us + s2.send_us) / 2,
                    std::max(s1.sends, s2.sends), std::max(s1.recvs, s2.recvs)};
    if (n == 1) hop_us = row.star.call_us / 2;
    rows.push_back(row);
    if (!json) {
      std::fprintf(stderr, "procs %4zu: spawned in %.0f ms; tree %.1f us, star %.1f us\n", n,
                   spawn_ms, row.tree.call_us, row.star.call_us);
    }
    if (!procs.stop(2s).get(60s)) die("stopping the procs timed out");
  }
  podium::mesh::set_cast_fanout(fanout);

  // Calibration from the largest and smallest sizes measured.
  const Row& big = rows.back();
  const Row& small = rows.front();
  double span = static_cast<double>(big.procs - small.procs);
  double send_us = big.star.send_us / static_cast<double>(big.procs);
  double recv_us = 0, member_us = 0;
  if (span > 0) {
    recv_us = std::max(0.0, (big.star.call_us - small.star.call_us) / span - send_us);
    member_us = std::max(0.0, (big.tree.send_us - static_cast<double>(fanout) * send_us) /
                                  static_cast<double>(big.procs));
  }
  if (hop_us == 0) hop_us = small.star.call_us / 2;

  if (json) {
    std::printf("{\"fanout\": %zu, \"sizes\": [", fanout);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf("%s{\"procs\": %zu, \"tree_us\": %.1f, \"star_us\": %.1f, "
                  "\"controller_sends\": %llu, \"controller_recvs\": %llu, "
                  "\"star_controller_sends\": %llu, \"star_controller_recvs\": %llu}",
                  i ? ", " : "", r.procs, r.tree.call_us, r.star.call_us,
                  static_cast<unsigned long long>(r.tree.sends),
                  static_cast<unsigned long long>(r.tree.recvs),
                  static_cast<unsigned long long>(r.star.sends),
                  static_cast<unsigned long long>(r.star.recvs));
    }
    std::printf("], \"calibration\": {\"hop_us\": %.2f, \"send_us\": %.3f, \"recv_us\": %.3f, "
                "\"member_us\": %.4f}, \"iters\": %d, \"cores\": %ld}\n",
                hop_us, send_us, recv_us, member_us, iters, ::sysconf(_SC_NPROCESSORS_ONLN));
  } else {
    std::printf("fan-out %zu, %d calls per mode\n", fanout, iters);
    std::printf("%8s %12s %12s %8s %8s\n", "procs", "tree_us", "star_us", "sends", "recvs");
    for (const Row& r : rows) {
      std::printf("%8zu %12.1f %12.1f %8llu %8llu\n", r.procs, r.tree.call_us, r.star.call_us,
                  static_cast<unsigned long long>(r.tree.sends),
                  static_cast<unsigned long long>(r.tree.recvs));
    }
    std::printf("calibration: hop %.2f us, send %.3f us, recv %.3f us, member %.4f us\n", hop_us,
                send_us, recv_us, member_us);
  }
  podium::shutdown();
  return 0;
}
