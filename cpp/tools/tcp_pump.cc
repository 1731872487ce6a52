// podium-tcp-pump: the raw TCP floor of `podium bench rdma-net` (python/podium/_src/
// bench_rdma_net.py). Plain sockets, no podium code: what the kernel's TCP moves between two
// hosts, the yardstick the data plane's cross-host figures are compared with.
//
//   podium-tcp-pump serve ADDR PORT MAX_BYTES   listens on ADDR:PORT, prints "ready", accepts
//                                               one connection; per 8-byte request N (little
//                                               endian) sends N bytes; ends when it closes.
//   podium-tcp-pump fetch ADDR PORT MAX_BYTES   connects, prints "ready"; per line "N [K]" on
//                                               stdin makes K (default 1) requests of N bytes
//                                               one after the other, each sent once the last
//                                               byte of the one before arrived, and prints the
//                                               seconds per request: from the first request to
//                                               the last byte of the last, over K (a timed run,
//                                               as the benchmark's figures are timed).
// TCP_NODELAY, kernel-autotuned buffers, send and recv of at most 4 MiB per call.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

namespace {

constexpr size_t kStep = size_t{4} << 20;

[[noreturn]] void die(const char* what) {
  std::perror(what);
  std::exit(1);
}

sockaddr_in address(const char* host, const char* port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::atoi(port)));
  if (::inet_pton(AF_INET, host, &a.sin_addr) != 1) die("inet_pton");
  return a;
}

bool full(int fd, void* p, size_t n, bool send) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    size_t step = n < kStep ? n : kStep;
    ssize_t r = send ? ::send(fd, c, step, MSG_NOSIGNAL) : ::recv(fd, c, step, 0);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

int serve(const sockaddr_in& a, size_t max) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(s, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) die("bind");
  if (::listen(s, 1) != 0) die("listen");
  std::printf("ready\n");
  std::fflush(stdout);
  int c = ::accept(s, nullptr, nullptr);
  if (c < 0) die("accept");
  ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<char> data(max, 'x');
  uint64_t n = 0;
  while (full(c, &n, sizeof n, false)) {
    if (n > max || !full(c, data.data(), n, true)) break;
  }
  return 0;
}

int fetch(const sockaddr_in& a, size_t max) {
  int c = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(c, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) die("connect");
  int one = 1;
  ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<char> data(max);
  std::printf("ready\n");
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
    size_t used = 0;
    uint64_t n = std::stoull(line, &used);
    uint64_t k = used < line.size() ? std::stoull(line.substr(used)) : 1;
    if (n > max || k == 0) return 2;
    auto t0 = std::chrono::steady_clock::now();
    for (uint64_t i = 0; i < k; ++i) {
      uint64_t ask = n;
      if (!full(c, &ask, sizeof ask, true) || !full(c, data.data(), n, false)) die("transfer");
    }
    std::chrono::duration<double> s = std::chrono::steady_clock::now() - t0;
    std::printf("%.9f\n", s.count() / static_cast<double>(k));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 || (std::strcmp(argv[1], "serve") != 0 && std::strcmp(argv[1], "fetch") != 0)) {
    std::fprintf(stderr, "usage: podium-tcp-pump serve|fetch ADDR PORT MAX_BYTES\n");
    return 2;
  }
  sockaddr_in a = address(argv[2], argv[3]);
  size_t max = std::strtoull(argv[4], nullptr, 10);
  return std::strcmp(argv[1], "serve") == 0 ? serve(a, max) : fetch(a, max);
}
