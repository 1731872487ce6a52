// The process-wide runtime and the entry points of runtime.h: init, init_controller,
// serve_proc, serve_worker, shutdown (bootstrap.h states BT-1 and BT-2).
#include "podium/mesh/bootstrap.h"
#include "podium/mesh/launch.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>
#include <condition_variable>
#include <algorithm>
#include <optional>

#include "podium/actor/message.h"
#include "podium/host/death_watch.h"
#include "podium/mesh/host_protocol.h"
#include "podium/mesh/job_config.h"
#include "podium/mesh/runtime_impl.h"

namespace podium {
namespace mesh {
namespace {

std::mutex g_mu;                           // guards g_runtime, g_fault_handler
std::unique_ptr<Runtime> g_runtime;        // set once by a start below
std::atomic<Runtime*> g_current{nullptr};  // g_runtime.get(), read without the lock
std::function<void(actor::MeshFailure)> g_fault_handler;  // empty: the default (BT-2)

// Publishes `rt` as this process's runtime; g_mu held.
void publish(std::unique_ptr<Runtime> rt) {
  g_runtime = std::move(rt);
  g_current.store(g_runtime.get(), std::memory_order_release);
}

// BT-4: ends the process with status 3 at `grace` from now, unless it has reached exit() by
// then: a C atexit handler (run after the language runtime finalized, before the static
// destructors) stops the thread and joins it. Made once, never destroyed.
struct ExitWatchdog {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread thread;
};
ExitWatchdog* g_watchdog = nullptr;  // set once, by the main thread (serve_proc)

void arm_exit_watchdog(std::chrono::milliseconds grace) {
  if (g_watchdog) return;
  auto* w = new ExitWatchdog();
  w->thread = std::thread([w, grace] {
    std::unique_lock lock(w->mu);
    if (w->cv.wait_for(lock, grace, [w] { return w->done; })) return;
    // No stdio (its locks may be held by the thread that hangs): one write(2), then _exit.
    char msg[160];
    int n = std::snprintf(msg, sizeof msg,
                          "podium proc %d: still running %lld ms after it was told to exit "
                          "(atexit handlers or finalizers hang); ending it\n",
                          static_cast<int>(::getpid()), static_cast<long long>(grace.count()));
    if (n > 0) (void)!::write(2, msg, std::min<size_t>(static_cast<size_t>(n), sizeof msg - 1));
    ::_exit(3);
  });
  g_watchdog = w;
  std::atexit([] {
    {
      std::lock_guard lock(g_watchdog->mu);
      g_watchdog->done = true;
    }
    g_watchdog->cv.notify_all();
    g_watchdog->thread.join();
  });
}

}  // namespace

Result<std::string> internal::make_socket_dir() {
  std::string base = "/tmp";
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x && ::access(x, W_OK) == 0) base = x;
  std::string user_dir = base + "/podium-" + std::to_string(::getuid());
  if (::mkdir(user_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return std::unexpected(errno_error("mkdir " + user_dir, errno));
  }
  struct stat st{};
  if (::lstat(user_dir.c_str(), &st) != 0) return std::unexpected(errno_error("stat " + user_dir, errno));
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::getuid() || (st.st_mode & 077) != 0) {
    return std::unexpected(make_error(BaseErrc::kIo, user_dir +
                                                         " must be a directory owned by this user "
                                                         "with mode 0700"));
  }
  if (size_t n = internal::sweep_stale_socket_dirs(user_dir); n > 0) {
    spdlog::debug("podium: removed {} socket directories of ended controllers in {}", n, user_dir);
  }
  std::random_device rd;
  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%08x", rd());
  std::string dir = user_dir + "/" + std::to_string(::getpid()) + "-" + suffix;
  if (::mkdir(dir.c_str(), 0700) != 0) return std::unexpected(errno_error("mkdir " + dir, errno));
  return dir;
}

std::string SpawnCommands::encode() const {
  std::string out =
      std::to_string(proc_argv.size()) + "," + std::to_string(zygote_argv.size()) + ",";
  for (const auto* argv : {&proc_argv, &zygote_argv}) {
    for (const auto& a : *argv) out += std::to_string(a.size()) + ":" + a;
  }
  return out;
}

Result<SpawnCommands> SpawnCommands::decode(std::string_view text) {
  auto bad = [&](const std::string& why) {
    return std::unexpected(make_error(BaseErrc::kInvalidArgument,
                                      "bad " + std::string(kSpawnEnv) + "='" + std::string(text) +
                                          "': " + why));
  };
  size_t at = 0;
  // A decimal number ending at `stop`; false when there is none.
  auto number = [&](char stop, size_t& out) {
    size_t end = text.find(stop, at);
    if (end == std::string_view::npos || end == at || end - at > 9) return false;
    out = 0;
    for (size_t i = at; i < end; ++i) {
      if (text[i] < '0' || text[i] > '9') return false;
      out = out * 10 + static_cast<size_t>(text[i] - '0');
    }
    at = end + 1;
    return true;
  };
  size_t np = 0, nz = 0;
  if (!number(',', np) || !number(',', nz)) return bad("expected '<n>,<n>,' first");
  SpawnCommands c;
  for (auto [argv, n] : {std::pair{&c.proc_argv, np}, std::pair{&c.zygote_argv, nz}}) {
    for (size_t i = 0; i < n; ++i) {
      size_t len = 0;
      if (!number(':', len)) {
        return bad("expected '<length>:' before argument " + std::to_string(i));
      }
      if (len > text.size() - at) return bad("an argument runs past the end");
      argv->emplace_back(text.substr(at, len));
      at += len;
    }
  }
  if (at != text.size()) return bad("text after the last argument");
  if (c.proc_argv.empty()) return bad("no proc command");
  return c;
}

std::string encode_lineage(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += std::to_string(k.size()) + ":" + k;
  return out;
}

Result<std::vector<std::string>> decode_lineage(std::string_view text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t colon = text.find(':', at);
    size_t len = 0;
    bool ok = colon != std::string_view::npos && colon > at && colon - at <= 9;
    for (size_t i = at; ok && i < colon; ++i) {
      ok = text[i] >= '0' && text[i] <= '9';
      if (ok) len = len * 10 + static_cast<size_t>(text[i] - '0');
    }
    if (!ok || len == 0 || len > text.size() - colon - 1) {
      return std::unexpected(make_error(
          BaseErrc::kInvalidArgument, "bad " + std::string(kLineageEnv) + "='" +
                                          std::string(text) + "': expected '<length>:<key>' at " +
                                          std::to_string(at)));
    }
    out.emplace_back(text.substr(colon + 1, len));
    at = colon + 1 + len;
  }
  return out;
}

std::chrono::milliseconds proc_exit_grace() {
  const char* v = std::getenv("PODIUM_PROC_EXIT_GRACE_MS");
  if (!v || !*v) return kProcExitGrace;
  char* end = nullptr;
  long long ms = std::strtoll(v, &end, 10);
  if (*end || ms <= 0) {
    spdlog::warn("podium: ignoring PODIUM_PROC_EXIT_GRACE_MS={}: not a positive number of "
                 "milliseconds", v);
    return kProcExitGrace;
  }
  return std::chrono::milliseconds(ms);
}

std::string Boot::encode() const {
  return parent.to_string() + ";" + listen.to_string() + ";" + std::to_string(mesh_id) + ";" +
         std::to_string(rank) + (reuse_port ? ";reuse_port" : "");
}

Result<Boot> Boot::decode(std::string_view line) {
  std::vector<std::string> f;
  size_t start = 0;
  for (size_t i = 0; i <= line.size(); ++i) {
    if (i == line.size() || line[i] == ';') {
      f.emplace_back(line.substr(start, i - start));
      start = i + 1;
    }
  }
  auto bad = [&](const std::string& why) {
    return std::unexpected(make_error(BaseErrc::kInvalidArgument, "bad " + std::string(kBootEnv) +
                                                                      "='" + std::string(line) +
                                                                      "': " + why));
  };
  if (f.size() != 4 && f.size() != 5) return bad("expected 4 or 5 fields");
  if (f.size() == 5 && f[4] != "reuse_port") return bad("the 5th field is not reuse_port");
  Boot b;
  b.reuse_port = f.size() == 5;
  auto parent = channel::Address::parse(f[0]);
  auto listen = channel::Address::parse(f[1]);
  if (!parent) return bad(parent.error().to_string());
  if (!listen) return bad(listen.error().to_string());
  b.parent = *parent;
  b.listen = *listen;
  for (auto [text, out] : {std::pair{&f[2], &b.mesh_id}, std::pair{&f[3], &b.rank}}) {
    char* end = nullptr;
    errno = 0;
    *out = std::strtoull(text->c_str(), &end, 10);
    if (text->empty() || *end || errno != 0) return bad("mesh id and rank must be numbers");
  }
  return b;
}

Runtime* Runtime::current() { return g_current.load(std::memory_order_acquire); }

Runtime& Runtime::get() {
  // Every cast asks; the runtime is set once and lives until the process exits.
  Runtime* rt = g_current.load(std::memory_order_acquire);
  if (!rt) {
    spdlog::critical("podium: podium::init() must be called before using meshes");
    std::abort();
  }
  return *rt;
}

}  // namespace mesh

bool is_proc() { return std::getenv(mesh::kBootEnv) != nullptr; }

Status serve_proc() {
  const char* env = std::getenv(mesh::kBootEnv);
  if (!env) {
    return std::unexpected(make_error(BaseErrc::kInvalidArgument,
                                      std::string(mesh::kBootEnv) + " is not set: not a proc"));
  }
  auto boot = mesh::Boot::decode(env);
  if (!boot) return std::unexpected(boot.error());
  // BT-3: the commands this proc's own procs start with, as its spawner's.
  std::optional<mesh::SpawnCommands> commands;
  if (const char* s = std::getenv(mesh::kSpawnEnv)) {
    auto c = mesh::SpawnCommands::decode(s);
    if (!c) return std::unexpected(c.error());
    commands = std::move(*c);
  }
  std::vector<std::string> lineage;  // BT-5
  if (const char* l = std::getenv(mesh::kLineageEnv)) {
    auto keys = mesh::decode_lineage(l);
    if (!keys) return std::unexpected(keys.error());
    lineage = std::move(*keys);
  }
  ::unsetenv(mesh::kBootEnv);  // BT-1: actors that start programs must not make them procs
  ::unsetenv(mesh::kSpawnEnv);
  ::unsetenv(mesh::kLineageEnv);
  if (const char* bind = std::getenv(mesh::kBindEnv)) {  // LA-1: before any runtime thread
    if (auto bound = mesh::apply_bind(bind); !bound) return std::unexpected(bound.error());
    ::unsetenv(mesh::kBindEnv);
  }
  // DW-1: the spawner hears of this proc's death when its exit begins (a thread of its own,
  // started after the binding so that it keeps to the bound cores).
  if (auto watched = host::attach_death_watch(); !watched) {
    spdlog::debug("podium: proc not death-watched: {}", watched.error().to_string());
  }
  {
    std::lock_guard lock(mesh::g_mu);
    if (mesh::g_runtime) {
      return std::unexpected(make_error(BaseErrc::kInvalidArgument, "the runtime is already running"));
    }
    mesh::RuntimeConfig config;
    config.listen = boot->listen;
    config.parent = boot->parent;
    config.reuse_port = boot->reuse_port;
    config.lineage = std::move(lineage);
    // A local proc of a client attached through a gateway (GW-3): it reaches every TCP
    // address, its controller's included, through that gateway too.
    if (const char* via = std::getenv(mesh::kViaEnv);
        via && *via && boot->listen.transport == channel::Transport::kUnix) {
      if (auto a = channel::Address::parse(via)) config.net_via = *a;
    }
    if (commands) {
      config.spawn.proc_argv = std::move(commands->proc_argv);
      config.spawn.zygote_argv = std::move(commands->zygote_argv);
    }
    config.fault_handler = mesh::g_fault_handler;
    auto rt = mesh::make_runtime(std::move(config));
    if (!rt) return std::unexpected(rt.error());
    mesh::publish(std::move(*rt));
  }
  actor::Proc& proc = mesh::g_runtime->proc();
  proc.serve_held_system_ops();
  proc.send(boot->parent,
            actor::system_message(proc.id(), actor::ProcId{boot->parent},
                                  mesh::proto::Ready{boot->listen.to_string(), boot->mesh_id,
                                                     boot->rank, static_cast<uint64_t>(::getpid())}
                                      .encode()));
  // The controller's "exit" ends the loop; its death ends the process (PR_SET_PDEATHSIG).
  proc.wait_exit_requested(std::chrono::hours(24 * 365 * 100));
  // BT-4: from here the process has proc_exit_grace() to end; the procs it spawned get half
  // of it to exit (ME-14), then the runtime stops and the caller finalizes.
  auto grace = mesh::proc_exit_grace();
  mesh::arm_exit_watchdog(grace);
  mesh::g_runtime->stop_spawned(grace / 2);
  mesh::g_runtime->shutdown();
  return ok();
}

Status init_controller(InitOptions options) {
  std::lock_guard lock(mesh::g_mu);
  if (mesh::g_runtime) return ok();
  auto dir = mesh::internal::make_socket_dir();
  if (!dir) return std::unexpected(dir.error());
  if (auto made = mesh::internal::ensure_controller_secret(*dir); !made) {
    std::error_code ec;
    std::filesystem::remove_all(*dir, ec);
    return std::unexpected(made.error());
  }
  channel::Address listen{channel::Transport::kUnix, *dir + "/controller.sock", 0};
  if (options.listen) listen = *options.listen;
  // The procs this client spawns on its host reach TCP through its gateway too (GW-3).
  if (options.via) ::setenv(mesh::kViaEnv, options.via->to_string().c_str(), 1);
  bool tcp = listen.transport == channel::Transport::kTcp;
  mesh::RuntimeConfig config;
  config.listen = std::move(listen);
  config.sock_dir = *dir;
  config.spawn = std::move(options);
  config.fault_handler = mesh::g_fault_handler;
  auto rt = mesh::make_runtime(std::move(config));
  if (!rt) {
    ::unsetenv(mesh::kViaEnv);  // a failed attach leaves a later local start as it was
    return std::unexpected(rt.error());
  }
  mesh::publish(std::move(*rt));
  if (auto secret = mesh::internal::job_secret(); tcp && secret && secret->empty()) {
    // PODIUM_INSECURE=1 (SE-1 made no secret): say so, as an insecure worker does (SE-2).
    std::fprintf(stderr,
                 "podium: WARNING: PODIUM_INSECURE=1: this controller and its procs accept "
                 "unauthenticated TCP connections on %s; anyone who can reach them can run "
                 "code here\n",
                 mesh::g_runtime->proc().id().addr.to_string().c_str());
    std::fflush(stderr);
  }
  mesh::g_runtime->proc().serve_held_system_ops();
  std::atexit(shutdown);
  return ok();
}

std::string default_host_address() {
  if (const char* a = std::getenv("PODIUM_HOST_ADDR"); a && *a) return a;
  // The source address of the route to a public address: connect() on a UDP socket sends
  // nothing.
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(9);
    ::inet_pton(AF_INET, "192.0.2.1", &to.sin_addr);  // TEST-NET-1: never answered
    sockaddr_in me{};
    socklen_t len = sizeof me;
    char buf[INET_ADDRSTRLEN] = {};
    bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0 &&
              ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0 &&
              me.sin_addr.s_addr != 0 && ::inet_ntop(AF_INET, &me.sin_addr, buf, sizeof buf);
    ::close(fd);
    if (ok) return buf;
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (::getaddrinfo(actor::host_name().c_str(), nullptr, &hints, &res) == 0 && res) {
    char buf[INET_ADDRSTRLEN] = {};
    auto* in = reinterpret_cast<sockaddr_in*>(res->ai_addr);
    bool ok = ::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf) != nullptr;
    ::freeaddrinfo(res);
    if (ok) return buf;
  }
  return "127.0.0.1";
}

Status serve_worker(WorkerOptions options) {
  auto bad = [](std::string why) {
    return std::unexpected(make_error(BaseErrc::kInvalidArgument, std::move(why)));
  };
  bool unix_socket = options.listen.transport == channel::Transport::kUnix;
  if (options.listen.transport != channel::Transport::kTcp && !unix_socket) {
    return bad("a worker listens on tcp://HOST:PORT or ipc://PATH, not " +
               options.listen.to_string());
  }
  if (unix_socket && options.listen_fd >= 0) {
    return bad("an inherited socket (fdN) is a TCP one; ipc:// binds its path");
  }
  // A worker started by an attached client (a LocalJob) is no client's local proc: its procs
  // dial what they reach directly.
  ::unsetenv(mesh::kViaEnv);
  // SE-2: a worker accepts controllers from other machines; it does so unauthenticated only
  // when told to.
  auto secret = mesh::internal::job_secret();
  if (!secret) return std::unexpected(secret.error());
  if (secret->empty() && !options.insecure) {
    return bad("refusing to listen on " + options.listen.to_string() +
               " without the job's secret: set PODIUM_SECRET_FILE (a file of mode 0600 holding "
               "the secret; PODIUM_SECRET also works), or pass --insecure to accept "
               "unauthenticated connections (anyone who can reach this port can then run code "
               "in this worker's procs)");
  }
  {
    std::lock_guard lock(mesh::g_mu);
    if (mesh::g_runtime) return bad("the podium runtime already runs in this process");
    mesh::RuntimeConfig config;
    config.listen = options.listen;
    config.advertise = options.advertise;
    config.listen_fd = options.listen_fd;
    if (unix_socket) {  // its procs listen on Unix sockets too, in a 0700 directory
      auto dir = mesh::internal::make_socket_dir();
      if (!dir) return std::unexpected(dir.error());
      config.worker_sock_dir = *dir;
    }
    config.worker = true;
    config.persistent = options.persistent;
    config.until_shutdown = options.until_shutdown;
    config.spawn = std::move(options.procs);
    config.fault_handler = mesh::g_fault_handler;
    auto rt = mesh::make_runtime(std::move(config));
    if (!rt) return std::unexpected(rt.error());
    mesh::publish(std::move(*rt));
  }
  auto& rt = *mesh::g_runtime;
  if (secret->empty()) {
    std::fprintf(stderr,
                 "podium worker: WARNING: --insecure: %s accepts unauthenticated connections; "
                 "anyone who can reach it can run code here\n",
                 rt.proc().id().addr.to_string().c_str());
    std::fflush(stderr);
  }
  rt.proc().serve_held_system_ops();
  spdlog::debug("podium worker: listening on {} (host {})", rt.proc_key(), actor::host_name());
  if (options.on_listening) options.on_listening(rt.proc().id().addr);
  rt.proc().wait_exit_requested(std::chrono::hours(24 * 365 * 100));
  mesh::g_runtime->shutdown();
  return ok();
}

void init(int argc, char** argv) {
  if (is_proc()) {
    auto st = serve_proc();
    if (!st) spdlog::critical("podium proc: {}", st.error().to_string());
    std::fflush(nullptr);
    ::_exit(st ? 0 : 2);
  }
  // Procs re-enter this binary; argv[0] may be relative to a directory they do not start
  // in, so the binary itself is named, before anything is published.
  std::vector<std::string> argv_copy(argv, argv + argc);
  if (!argv_copy.empty()) argv_copy[0] = mesh::self_exe();
  auto st = init_controller(InitOptions{std::move(argv_copy)});
  if (!st) {
    spdlog::critical("podium: cannot start the runtime: {}", st.error().to_string());
    std::abort();
  }
}

void set_unhandled_fault_handler(std::function<void(actor::MeshFailure)> handler) {
  std::lock_guard lock(mesh::g_mu);
  mesh::g_fault_handler = handler;
  if (mesh::g_runtime) {
    mesh::g_runtime->supervisor().set_root_handler(
        handler ? std::move(handler) : mesh::default_root_handler(mesh::g_runtime->impl()));
  }
}

void shutdown() {
  mesh::Runtime* rt = nullptr;
  {
    std::lock_guard lock(mesh::g_mu);
    rt = mesh::g_runtime.get();
  }
  // The runtime object lives until the process exits; only its services stop here.
  if (rt) rt->shutdown();
}

}  // namespace podium
