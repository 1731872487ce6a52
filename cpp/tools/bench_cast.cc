// podium-bench-cast: call() on meshes of 1..256 C++ procs, through the cast tree and through
// the naive star (the controller sends to every actor itself), in the same run.
//
//   podium bench cast [--json] [--fanout K] [--sizes 1,8,64,256] [--iters N]
//
// Per size: tree_us / star_us, the median latency of call() (every rank answers); and
// controller_sends / controller_recvs, the envelopes the controller's proc sent to and received
// from other procs per tree call (Proc::traffic, AC-12), the largest over the timed calls.
// Each row also has the CPU time per call of the controller process and of all procs together
// (getrusage, /proc/<pid>/task/*/schedstat), tree and star, and the calling thread's CPU time
// inside call_raw (*_start_cpu_us: building and sending the cast, before any reply).
// "calibration" holds the per-hop costs `podium sim cast` builds its model from (docs/cast.md):
//   hop_us     half the round trip of a call to one actor in another proc (1 proc)
//   send_us    the calling thread's CPU time per message sent in a star cast (largest size)
//   recv_us    the rest of the controller's CPU time per rank of a star cast (a reply's
//              arrival and handling; largest size)
//   member_us  the root's CPU time per rank of a tree cast (each rank's AC-11 number, the
//              rank tables, gathering the replies into the caller's Replies), measured alone
//              at 1,000, 10,000 and 100,000 ranks without procs ("root": plan_us, gather_us
//              per call): the slope between the smallest and the largest
//   proc_us    one proc's CPU time per call (wake-up, handler, reply; 1 proc)
//   contention how much more CPU a proc spent per call at the largest size (cores shared)
//   relay_us   the procs' extra CPU time per rank in a tree over a star, at the largest size,
//              divided by `contention`
//
// The machine's own floor, measured in the same run (docs/cast.md, "Benchmark"): N plain
// processes (forked, no podium in them) that each wait in read() on a Unix socket for one
// byte and answer with one byte, wired as a star (the controller writes to and reads from all
// N) and as a tree of the same fan-out and shape as the relay tree (a node writes to its
// children, reads their bytes, then answers its parent):
//   raw_star_us / raw_tree_us   median round trip of one byte through all N
//   depth                       hops from the controller to the deepest rank of the tree
// With N procs on C cores, waking N processes costs at least N wake-ups over C cores;
// tree_us / raw_tree_us is what podium's cast adds on top of that.
//
// PODIUM_POLL_US defaults to 0 here (every proc sleeps in epoll_wait): 256 procs that poll
// would share 2 cores; set it to measure with polling.
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "podium/actor/executor.h"
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

double thread_cpu_us() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

double self_cpu_us() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto us = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_usec);
  };
  return us(ru.ru_utime) + us(ru.ru_stime);
}

// What one process spent, summed over its threads: CPU time (/proc/<pid>/task/*/schedstat,
// nanoseconds on a CPU: the first field) and context switches (voluntary: the thread slept
// and was woken again, i.e. one wake-up; involuntary: it was preempted), from
// /proc/<pid>/task/*/status.
struct TaskStats {
  double cpu_us = 0;
  double wakeups = 0;
  double preempted = 0;
  TaskStats& operator+=(const TaskStats& o) {
    cpu_us += o.cpu_us;
    wakeups += o.wakeups;
    preempted += o.preempted;
    return *this;
  }
  TaskStats operator+(const TaskStats& o) const {
    return TaskStats{cpu_us + o.cpu_us, wakeups + o.wakeups, preempted + o.preempted};
  }
  TaskStats operator-(const TaskStats& o) const {
    return TaskStats{cpu_us - o.cpu_us, wakeups - o.wakeups, preempted - o.preempted};
  }
  TaskStats scaled(double f) const { return TaskStats{cpu_us * f, wakeups * f, preempted * f}; }
};

TaskStats process_stats(pid_t pid) {
  TaskStats out;
  std::error_code ec;
  std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/task", ec);
  if (ec) return out;
  for (const auto& task : it) {
    if (FILE* f = std::fopen((task.path() / "schedstat").c_str(), "r")) {
      unsigned long long ns = 0;
      if (std::fscanf(f, "%llu", &ns) == 1) out.cpu_us += static_cast<double>(ns) / 1e3;
      std::fclose(f);
    }
    if (FILE* f = std::fopen((task.path() / "status").c_str(), "r")) {
      char line[256];
      unsigned long long v = 0;
      while (std::fgets(line, sizeof line, f)) {
        if (std::sscanf(line, "voluntary_ctxt_switches: %llu", &v) == 1) {
          out.wakeups += static_cast<double>(v);
        } else if (std::sscanf(line, "nonvoluntary_ctxt_switches: %llu", &v) == 1) {
          out.preempted += static_cast<double>(v);
        }
      }
      std::fclose(f);
    }
  }
  return out;
}

std::vector<TaskStats> mesh_stats(const podium::ProcMesh& procs) {
  std::vector<TaskStats> out(procs.size());
  for (size_t r = 0; r < procs.size(); ++r) out[r] = process_stats(procs.pid(r));
  return out;
}

struct Mode {
  double call_us = 0;   // median call() latency
  double send_us = 0;   // median CPU time of the calling thread inside call_raw
  double self_cpu_us = 0;   // the controller process's CPU time per call
  double procs_cpu_us = 0;  // every proc's CPU time per call, together
  uint64_t sends = 0;   // most controller sends in one call
  uint64_t recvs = 0;   // most controller receives in one call
  TaskStats controller;           // the controller process, per call
  std::vector<TaskStats> per_rank;  // each proc of the mesh, per call
};

Mode measure(const podium::ProcMesh& procs, const podium::ActorMesh<Echo>& mesh, size_t fanout,
             int iters) {
  podium::mesh::set_cast_fanout(fanout);
  auto& proc = podium::mesh::Runtime::get().proc();
  auto arg = podium::detail::pack(std::tuple<int>(1));
  std::vector<double> lat, send;
  Mode m;
  double self0 = 0;
  TaskStats ctl0;
  std::vector<TaskStats> ranks0;
  for (int i = 0; i < iters + 3; ++i) {
    if (i == 3) {  // reading every proc's /proc files costs this process ~2 ms at 256 procs
      ranks0 = mesh_stats(procs);
      ctl0 = process_stats(::getpid());
      self0 = self_cpu_us();
    }
    auto before = proc.traffic();
    auto t0 = Clock::now();
    double c0 = thread_cpu_us();
    auto f = mesh.call_raw("ping", {arg});
    double s = thread_cpu_us() - c0;
    auto r = f.get(30s);
    double l = us_since(t0);
    auto after = proc.traffic();
    if (!r) die("call: " + r.error().to_string());
    if (auto bad = r->first_error()) {
      die("rank " + std::to_string(bad->first) + ": " + bad->second->to_string());
    }
    if (i < 3) continue;  // warm-up: connections, first-touch
    lat.push_back(l);
    send.push_back(s);
    m.sends = std::max(m.sends, after.sent - before.sent);
    m.recvs = std::max(m.recvs, after.received - before.received);
  }
  // Before the /proc reads, not after.
  m.self_cpu_us = (self_cpu_us() - self0) / iters;
  m.controller = (process_stats(::getpid()) - ctl0).scaled(1.0 / iters);
  auto ranks1 = mesh_stats(procs);
  m.per_rank.resize(ranks1.size());
  for (size_t r = 0; r < ranks1.size(); ++r) {
    m.per_rank[r] = (ranks1[r] - ranks0[r]).scaled(1.0 / iters);
    m.procs_cpu_us += m.per_rank[r].cpu_us;
  }
  m.call_us = median(lat);
  m.send_us = median(send);
  return m;
}

// --- the root's own work -------------------------------------------------------------------

// The controller's work per tree call that is not sending or receiving messages, at `n`
// ranks, without procs (so that no other process competes for the cores): the library's own
// steps, in the order a call takes them: the plan (each rank's AC-11 number, the rank
// tables), the collector and its tracking (ME-2), then the k reduced replies of a tree whose
// actors all answered alike gathered into the caller's Replies. The targets are named as a
// real mesh's are (one proc per rank), so their tables compress the same way.
struct RootCost {
  size_t ranks = 0;
  double plan_us = 0;    // median
  double gather_us = 0;  // median
};

RootCost root_cost(size_t n, size_t fanout, int iters) {
  namespace pm = podium::mesh;
  std::vector<pm::ActorTarget> storage(n);
  std::vector<const pm::ActorTarget*> targets(n);
  std::vector<size_t> base(n);
  for (size_t r = 0; r < n; ++r) {
    std::string proc = "unix:/tmp/podium-root-bench/p" + std::to_string(r) + ".sock,p" +
                       std::to_string(r);
    storage[r].dest = proc + "#echo[" + std::to_string(r) + "]:0";
    storage[r].actor = proc + "#echo[" + std::to_string(r) + "]";
    storage[r].proc_key = proc;
    targets[r] = &storage[r];
    base[r] = r;
  }
  auto to = pm::CastTargets::build(std::move(targets), std::move(base), true);
  auto extent = podium::ndslice::Extent::make({"procs"}, {n});
  if (!extent) die("root bench: " + extent.error().to_string());
  auto arg = podium::detail::pack(std::tuple<int>(1));
  auto answer = podium::detail::pack(std::tuple<int>(1));
  auto chunks = pm::split_chunks(0, n, fanout);
  auto& rt = pm::Runtime::get();
  std::vector<double> plan, gather;
  for (int i = 0; i < iters + 2; ++i) {
    double c0 = thread_cpu_us();
    auto p = pm::make_tree_plan(*to, *extent, "ping", {arg}, true);
    auto collector = std::make_shared<pm::Collector>(to->proc_keys);
    rt.track(collector, *to->proc_keys, &to->clean_generation);
    double c1 = thread_cpu_us();
    for (auto c : chunks) collector->fill_range(c.lo, c.hi, pm::Reply(std::vector{answer}));
    auto r = collector->future().get(1s);
    if (!r || r->first_error() || r->size() != n) die("root bench: the gather went wrong");
    double c2 = thread_cpu_us();
    if (i < 2) continue;  // first use: the AC-11 counters, the port tables
    plan.push_back(c1 - c0);
    gather.push_back(c2 - c1);
  }
  return RootCost{n, median(plan), median(gather)};
}

// --- the raw floor ---------------------------------------------------------------------------

bool read_byte(int fd) {
  char c;
  for (;;) {
    ssize_t n = ::read(fd, &c, 1);
    if (n == 1) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

bool write_byte(int fd) {
  char c = 1;
  for (;;) {
    ssize_t n = ::write(fd, &c, 1);
    if (n == 1) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

// One raw node: a byte from `up` goes to every child, their bytes come back, one goes up.
// Runs in a forked child of a threaded process: system calls only, no allocation.
[[noreturn]] void raw_node(int up, const int* down, size_t ndown) {
  while (read_byte(up)) {
    for (size_t i = 0; i < ndown; ++i) write_byte(down[i]);
    for (size_t i = 0; i < ndown; ++i) read_byte(down[i]);
    write_byte(up);
  }
  ::_exit(0);
}

// N forked processes wired as the relay tree with fan-out k would be (k >= N: a star).
class RawMesh {
 public:
  RawMesh(size_t n, size_t k) {
    // pair[r]: [0] the parent's end, [1] rank r's end.
    std::vector<std::array<int, 2>> pair(n);
    for (auto& p : pair) {
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p.data()) != 0) {
        die("socketpair failed (raw floor)");
      }
    }
    std::vector<std::vector<int>> down(n);  // rank -> the parent ends of its children
    auto wire = [&](auto&& self, podium::mesh::Chunk c) -> void {
      for (auto sub : podium::mesh::split_chunks(c.lo + 1, c.hi, k)) {
        down[c.lo].push_back(pair[sub.lo][0]);
        self(self, sub);
      }
    };
    for (auto c : podium::mesh::split_chunks(0, n, k)) {
      top_.push_back(pair[c.lo][0]);
      wire(wire, c);
    }
    for (size_t r = 0; r < n; ++r) {
      pid_t pid = ::fork();
      if (pid < 0) die("fork failed (raw floor)");
      if (pid == 0) {
        // Keep only this rank's fds.
        for (size_t q = 0; q < n; ++q) {
          if (q != r) ::close(pair[q][1]);
          bool mine = std::find(down[r].begin(), down[r].end(), pair[q][0]) != down[r].end();
          if (!mine) ::close(pair[q][0]);
        }
        raw_node(pair[r][1], down[r].data(), down[r].size());
      }
      pids_.push_back(pid);
    }
    for (size_t r = 0; r < n; ++r) {
      ::close(pair[r][1]);
      if (std::find(top_.begin(), top_.end(), pair[r][0]) == top_.end()) ::close(pair[r][0]);
    }
  }
  ~RawMesh() {
    for (int fd : top_) ::close(fd);  // EOF: every node exits, its children after it
    for (pid_t p : pids_) ::waitpid(p, nullptr, 0);
  }
  RawMesh(const RawMesh&) = delete;
  RawMesh& operator=(const RawMesh&) = delete;

  // Every node's CPU time and context switches so far, summed.
  TaskStats stats() const {
    TaskStats t;
    for (pid_t p : pids_) t += process_stats(p);
    return t;
  }
  size_t size() const { return pids_.size(); }

  double round_trip_us() {
    auto t0 = Clock::now();
    for (int fd : top_) write_byte(fd);
    for (int fd : top_) {
      if (!read_byte(fd)) die("raw floor: a node went away");
    }
    return us_since(t0);
  }

 private:
  std::vector<int> top_;
  std::vector<pid_t> pids_;
};

// Hops from the sender to the deepest rank of the relay tree (1: a star).
size_t chunk_hops(size_t size, size_t k) {
  size_t deepest = 0;
  for (auto c : podium::mesh::split_chunks(1, size, k)) {
    deepest = std::max(deepest, chunk_hops(c.hi - c.lo, k));
  }
  return 1 + deepest;
}

size_t tree_depth(size_t n, size_t k) {
  if (n <= k) return 1;
  size_t deepest = 0;
  for (auto c : podium::mesh::split_chunks(0, n, k)) {
    deepest = std::max(deepest, chunk_hops(c.hi - c.lo, k));
  }
  return deepest;
}

struct Floor {
  double star_us = 0;
  double tree_us = 0;
  TaskStats star_proc, tree_proc;  // per proc per round trip
};

// Star and tree alternate, as podium's two modes do.
Floor measure_floor(size_t n, size_t k, int iters) {
  RawMesh star(n, n), tree(n, k);
  std::vector<double> s, t;
  TaskStats star0, tree0;
  for (int i = 0; i < iters + 3; ++i) {
    if (i == 3) {
      star0 = star.stats();
      tree0 = tree.stats();
    }
    double a = star.round_trip_us();
    double b = tree.round_trip_us();
    if (i < 3) continue;
    s.push_back(a);
    t.push_back(b);
  }
  double per = 1.0 / (static_cast<double>(iters) * static_cast<double>(n));
  return Floor{median(s), median(t), (star.stats() - star0).scaled(per),
               (tree.stats() - tree0).scaled(per)};
}

// Which ranks of a tree cast to n ranks with fan-out k are relays (heads of a chunk of more
// than one rank, CT-2); the others are leaves. All leaves for a star (n <= k).
std::vector<bool> relay_ranks(size_t n, size_t k) {
  std::vector<bool> relay(n, false);
  if (n <= k) return relay;
  auto walk = [&](auto&& self, podium::mesh::Chunk c) -> void {
    if (c.hi - c.lo > 1) relay[c.lo] = true;
    for (auto sub : podium::mesh::split_chunks(c.lo + 1, c.hi, k)) self(self, sub);
  };
  for (auto c : podium::mesh::split_chunks(0, n, k)) walk(walk, c);
  return relay;
}

// The mean per-call stats of the ranks with relay[r] == want.
TaskStats role_mean(const std::vector<TaskStats>& per_rank, const std::vector<bool>& relay,
                    bool want) {
  TaskStats sum;
  size_t count = 0;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    if (relay[r] != want) continue;
    sum += per_rank[r];
    ++count;
  }
  return count ? sum.scaled(1.0 / static_cast<double>(count)) : TaskStats{};
}

std::vector<size_t> parse_sizes(const std::string& s) {
  std::vector<size_t> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) {
      out.push_back(std::strtoull(s.substr(start, comma - start).c_str(), nullptr, 10));
    }
    start = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  bool poll_set = std::getenv("PODIUM_POLL_US") != nullptr;
  ::setenv("PODIUM_POLL_US", "0", 0);  // the procs read it when they start
  podium::init(argc, argv);
  // This process read it before main(): set the controller's own polling too.
  if (!poll_set) {
    podium::actor::Executor::set_poll(std::chrono::nanoseconds(0), std::chrono::nanoseconds(0));
  }
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
    Floor floor;
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
    Row row{n, {}, {}, {}};
    // Alternate so that drift on a shared machine hits both alike.
    Mode t1 = measure(procs, echo, fanout, iters / 2);
    Mode s1 = measure(procs, echo, 0, iters / 2);
    Mode t2 = measure(procs, echo, fanout, iters - iters / 2);
    Mode s2 = measure(procs, echo, 0, iters - iters / 2);
    auto both = [](const Mode& a, const Mode& b) {
      Mode m{(a.call_us + b.call_us) / 2,         (a.send_us + b.send_us) / 2,
             (a.self_cpu_us + b.self_cpu_us) / 2, (a.procs_cpu_us + b.procs_cpu_us) / 2,
             std::max(a.sends, b.sends),          std::max(a.recvs, b.recvs),
             (a.controller + b.controller).scaled(0.5), {}};
      m.per_rank.resize(a.per_rank.size());
      for (size_t r = 0; r < a.per_rank.size(); ++r) {
        m.per_rank[r] = a.per_rank[r];
        m.per_rank[r] += b.per_rank[r];
        m.per_rank[r] = m.per_rank[r].scaled(0.5);
      }
      return m;
    };
    row.tree = both(t1, t2);
    row.star = both(s1, s2);
    if (n == 1) hop_us = row.star.call_us / 2;
    rows.push_back(row);
    if (!json) {
      std::fprintf(stderr, "procs %4zu: spawned in %.0f ms; tree %.1f us, star %.1f us\n", n,
                   spawn_ms, row.tree.call_us, row.star.call_us);
    }
    if (!procs.stop(2s).get(60s)) die("stopping the procs timed out");
    row.floor = measure_floor(n, n > fanout ? fanout : n, iters);
    rows.back().floor = row.floor;
  }
  podium::mesh::set_cast_fanout(fanout);

  // Calibration (docs/cast.md). Wall-clock and per-proc costs from the smallest size (one
  // proc: no contention for the cores); the controller's CPU per message and the relays' extra
  // CPU from the largest, the latter scaled by how much contention inflated a proc's CPU there.
  const Row& big = rows.back();
  const Row& small = rows.front();
  double nb = static_cast<double>(big.procs);
  double ns = static_cast<double>(small.procs);
  double send_us = big.star.send_us / nb;
  double recv_us = std::max(0.0, big.star.self_cpu_us / nb - send_us);
  double proc_us = small.star.procs_cpu_us / ns;
  double contention = std::max(1.0, big.star.procs_cpu_us / nb / std::max(proc_us, 1e-3));
  // The root's per-rank work, measured alone (root_cost): the slope between its smallest and
  // largest size. The process-CPU difference between two mesh sizes used before is dominated
  // on a small machine by what N procs on its cores cost the kernel (wake-ups, cache), which a
  // cluster with a core per proc does not pay; it is still in the rows (tree_controller_cpu_us).
  podium::mesh::set_cast_fanout(fanout);
  std::vector<RootCost> root;
  for (size_t n : {size_t{1000}, size_t{10000}, size_t{100000}}) {
    root.push_back(root_cost(n, fanout, 15));
  }
  auto root_total = [](const RootCost& c) { return c.plan_us + c.gather_us; };
  double member_us = std::max(
      0.0, (root_total(root.back()) - root_total(root.front())) /
               static_cast<double>(root.back().ranks - root.front().ranks));
  double relay_us = 0;
  if (big.procs > fanout) {
    relay_us = std::max(0.0, (big.tree.procs_cpu_us - big.star.procs_cpu_us) / nb) / contention;
  }
  if (hop_us == 0) hop_us = small.star.call_us / 2;

  if (json) {
    std::printf("{\"fanout\": %zu, \"sizes\": [", fanout);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf("%s{\"procs\": %zu, \"tree_us\": %.1f, \"star_us\": %.1f, "
                  "\"controller_sends\": %llu, \"controller_recvs\": %llu, "
                  "\"star_controller_sends\": %llu, \"star_controller_recvs\": %llu, "
                  "\"tree_controller_cpu_us\": %.1f, \"star_controller_cpu_us\": %.1f, "
                  "\"tree_procs_cpu_us\": %.1f, \"star_procs_cpu_us\": %.1f, "
                  "\"depth\": %zu, \"raw_tree_us\": %.1f, \"raw_star_us\": %.1f, "
                  "\"tree_over_raw_tree\": %.2f, \"star_over_raw_star\": %.2f, "
                  "\"tree_start_cpu_us\": %.1f, \"star_start_cpu_us\": %.1f, ",
                  i ? ", " : "", r.procs, r.tree.call_us, r.star.call_us,
                  static_cast<unsigned long long>(r.tree.sends),
                  static_cast<unsigned long long>(r.tree.recvs),
                  static_cast<unsigned long long>(r.star.sends),
                  static_cast<unsigned long long>(r.star.recvs), r.tree.self_cpu_us,
                  r.star.self_cpu_us, r.tree.procs_cpu_us, r.star.procs_cpu_us,
                  tree_depth(r.procs, fanout), r.floor.tree_us, r.floor.star_us,
                  r.tree.call_us / std::max(r.floor.tree_us, 1e-3),
                  r.star.call_us / std::max(r.floor.star_us, 1e-3), r.tree.send_us,
                  r.star.send_us);
      // Per call, per process of each role (docs/cast.md, "Where a cast's time goes").
      auto relay = relay_ranks(r.procs, fanout);
      std::vector<bool> none(r.procs, false);
      auto stats = [](const char* name, const TaskStats& t, bool last) {
        std::printf("\"%s\": {\"cpu_us\": %.1f, \"wakeups\": %.2f, \"preempted\": %.2f}%s",
                    name, t.cpu_us, t.wakeups, t.preempted, last ? "" : ", ");
      };
      std::printf("\"breakdown\": {");
      stats("tree_controller", r.tree.controller, false);
      stats("star_controller", r.star.controller, false);
      stats("tree_relay", role_mean(r.tree.per_rank, relay, true), false);
      stats("tree_leaf", role_mean(r.tree.per_rank, relay, false), false);
      stats("star_leaf", role_mean(r.star.per_rank, none, false), false);
      stats("raw_tree_proc", r.floor.tree_proc, false);
      stats("raw_star_proc", r.floor.star_proc, true);
      std::printf("}}");
    }
    std::printf("], \"root\": [");
    for (size_t i = 0; i < root.size(); ++i) {
      std::printf("%s{\"ranks\": %zu, \"plan_us\": %.1f, \"gather_us\": %.1f}", i ? ", " : "",
                  root[i].ranks, root[i].plan_us, root[i].gather_us);
    }
    std::printf("], \"calibration\": {\"hop_us\": %.2f, \"send_us\": %.3f, \"recv_us\": %.3f, "
                "\"member_us\": %.4f, \"proc_us\": %.2f, \"relay_us\": %.2f, "
                "\"contention\": %.2f, \"from_procs\": %zu}, \"iters\": %d, \"cores\": %ld}\n",
                hop_us, send_us, recv_us, member_us, proc_us, relay_us, contention, big.procs,
                iters,
                ::sysconf(_SC_NPROCESSORS_ONLN));
  } else {
    std::printf("fan-out %zu, %d calls per mode\n", fanout, iters);
    std::printf("%8s %6s %12s %12s %12s %12s %8s %8s\n", "procs", "depth", "tree_us",
                "raw_tree_us", "star_us", "raw_star_us", "sends", "recvs");
    for (const Row& r : rows) {
      std::printf("%8zu %6zu %12.1f %12.1f %12.1f %12.1f %8llu %8llu\n", r.procs,
                  tree_depth(r.procs, fanout), r.tree.call_us, r.floor.tree_us, r.star.call_us,
                  r.floor.star_us, static_cast<unsigned long long>(r.tree.sends),
                  static_cast<unsigned long long>(r.tree.recvs));
    }
    for (const RootCost& c : root) {
      std::printf("root work at %zu ranks: plan %.1f us, gather %.1f us\n", c.ranks, c.plan_us,
                  c.gather_us);
    }
    std::printf("calibration: hop %.2f us, send %.3f us, recv %.3f us, member %.4f us, "
                "proc %.2f us, relay %.2f us\n",
                hop_us, send_us, recv_us, member_us, proc_us, relay_us);
  }
  podium::shutdown();
  return 0;
}
