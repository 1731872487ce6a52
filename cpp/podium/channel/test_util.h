// Helpers for the podium_channel tests: io threads, a private socket directory, and a
// receiver that checks order, uniqueness and serial delivery as envelopes arrive.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "podium/channel/net.h"

namespace podium::channel::testing {

using namespace std::chrono_literals;

// An io_context run by `threads` threads until destroyed. Declare it before the Nets that
// use it: the io_context must outlive them.
class IoThreads {
 public:
  explicit IoThreads(int threads = 1) : work_(io_.get_executor()) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { io_.run(); });
  }
  ~IoThreads() { join(); }
  // Stops the io_context and joins its threads: no handler runs after it returns.
  void join() {
    work_.reset();
    io_.stop();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  asio::io_context& io() { return io_; }
  bool runs_here() const {
    for (const auto& t : threads_) {
      if (t.get_id() == std::this_thread::get_id()) return true;
    }
    return false;
  }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::vector<std::thread> threads_;
};

// A fresh mode-0700 directory for socket files, removed with its contents.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/podium-channel-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string path(const std::string& name) const { return path_ + "/" + name; }
  const std::string& dir() const { return path_; }

 private:
  std::string path_;
};

// A unique name for inproc and abstract addresses.
inline std::string unique_name(const char* what) {
  static std::atomic<int> n{0};
  return std::string("podium-test-") + what + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(n++);
}

inline Config test_config() {
  Config c;
  c.delivery_timeout = 20s;
  c.reconnect_min = 1ms;
  c.reconnect_max = 20ms;
  c.ack_every = 64;
  c.ack_delay = 500us;
  return c;
}

// Envelope `i` of a stream: order_seq = i and a payload derived from i. Every `big_every`th
// envelope also carries a large part and an empty one.
inline wire::Envelope numbered(uint64_t i, size_t big_every = 0, size_t big_bytes = 200000) {
  wire::Envelope e;
  e.kind = 1;
  e.dest = "proc[1].actor[0].port[7]";
  e.sender = "proc[0].actor[0]";
  e.order_seq = i;
  std::string small(16, '\0');
  std::memcpy(small.data(), &i, sizeof i);
  e.parts.push_back(Buffer::from_string(std::move(small)));
  if (big_every && i % big_every == 0) {
    e.parts.emplace_back();
    std::string big(big_bytes, char('a' + i % 26));
    e.parts.push_back(Buffer::from_string(std::move(big)));
  }
  return e;
}

// Checks one stream as DeliverFn: envelopes 0, 1, 2, ... each once, in order (CH-1, CH-2),
// intact, and never two DeliverFn calls at once (CH-4).
class Receiver {
 public:
  DeliverFn fn() {
    return [this](wire::Envelope&& e) { on(std::move(e)); };
  }
  bool wait_for(uint64_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return count_ >= n; });
  }
  uint64_t count() {
    std::lock_guard lock(mu_);
    return count_;
  }
  std::string error() {
    std::lock_guard lock(mu_);
    return error_;
  }

 private:
  void on(wire::Envelope&& e) {
    std::string problem;
    if (inside_.exchange(true)) problem = "two DeliverFn calls at once";
    uint64_t seq = e.order_seq;
    uint64_t carried = ~uint64_t(0);
    if (!e.parts.empty() && e.parts[0].size() == 16) {
      std::memcpy(&carried, e.parts[0].data(), sizeof carried);
    }
    if (seq != next_) {
      problem = "expected envelope " + std::to_string(next_) + ", got " + std::to_string(seq);
    } else if (carried != seq) {
      problem = "payload of envelope " + std::to_string(seq) + " is damaged";
    } else if (e.parts.size() == 3) {
      const Buffer& big = e.parts[2];
      for (size_t i = 0; i < big.size(); i += 4093) {
        if (big.view()[i] != char('a' + seq % 26)) problem = "large part damaged";
      }
    }
    next_ = seq + 1;
    inside_.store(false);
    std::lock_guard lock(mu_);
    if (error_.empty()) error_ = problem;
    ++count_;
    cv_.notify_all();
  }

  std::atomic<bool> inside_{false};
  uint64_t next_ = 0;  // touched only inside DeliverFn, which CH-4 serialises
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t count_ = 0;  // guarded by mu_
  std::string error_;   // guarded by mu_: the first problem seen
};

// Collects what a Net hands back.
class Returns {
 public:
  UndeliverableFn fn() {
    return [this](wire::Envelope&& e, Error err) {
      std::lock_guard lock(mu_);
      items_.emplace_back(std::move(e), std::move(err));
      cv_.notify_all();
    };
  }
  bool wait_for(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return items_.size() >= n; });
  }
  std::vector<std::pair<wire::Envelope, Error>> take() {
    std::lock_guard lock(mu_);
    return std::move(items_);
  }
  size_t size() {
    std::lock_guard lock(mu_);
    return items_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<wire::Envelope, Error>> items_;
};

// A blocking client socket connected to `a` (unix or tcp), or -1.
inline int dial(const Address& a) {
  if (a.transport == Transport::kUnix) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, a.target.data(), a.target.size());
    if (a.target[0] == '@') sa.sun_path[0] = '\0';
    socklen_t len = offsetof(sockaddr_un, sun_path) + a.target.size() + (a.target[0] != '@');
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), len) == 0) return fd;
    ::close(fd);
    return -1;
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(a.port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) return fd;
  ::close(fd);
  return -1;
}

inline void write_all(int fd, std::span<const std::byte> b) {
  while (!b.empty()) {
    ssize_t n = ::send(fd, b.data(), b.size(), MSG_NOSIGNAL);
    if (n <= 0) return;  // the Net may close first; that is what the test waits for
    b = b.subspan(size_t(n));
  }
}

// True when the peer closes `fd` within `limit` (whatever it sent before, e.g. a HelloAck).
inline bool closed_by_peer(int fd, std::chrono::milliseconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  char buf[4096];
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;
  }
  return false;
}

// Polls `done` every 2 ms until it holds or `limit` passes; true when it held.
template <class Pred>
bool eventually(Pred done, std::chrono::milliseconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(2ms);
  }
}

// Routes spdlog's default logger (warnings and up) into a ring buffer for the test's life.
// Create it before any thread that logs and destroy it after them.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1024)) {
    auto logger = std::make_shared<spdlog::logger>("capture", sink_);
    logger->set_level(spdlog::level::warn);
    spdlog::set_default_logger(logger);
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  // Waits for a logged line that contains every one of `parts`.
  // Logged lines that contain `part`.
  size_t count(std::string_view part) {
    size_t n = 0;
    for (const auto& line : sink_->last_formatted()) n += line.find(part) != std::string::npos;
    return n;
  }
  bool wait_for(std::initializer_list<std::string_view> parts, std::chrono::milliseconds limit) {
    auto end = std::chrono::steady_clock::now() + limit;
    do {
      for (const auto& line : sink_->last_formatted()) {
        bool all = true;
        for (auto p : parts) all = all && line.find(p) != std::string::npos;
        if (all) return true;
      }
      std::this_thread::sleep_for(2ms);
    } while (std::chrono::steady_clock::now() < end);
    return false;
  }

 private:
  std::shared_ptr<spdlog::logger> previous_ = spdlog::default_logger();
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

}  // namespace podium::channel::testing
