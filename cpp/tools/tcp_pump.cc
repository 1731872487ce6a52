// podium-tcp-pump: the raw TCP floor of `podium bench rdma-net` (python/podium/_src/
// bench_rdma_net.py). Plain sockets, no podium code: what the kernel's TCP moves between two
// hosts, the yardstick the data plane's cross-host figures are compared with.
//
//   podium-tcp-pump serve ADDR PORT MAX_BYTES   listens on ADDR:PORT, prints "ready", accepts
//                                               one connection; per 8-byte request N (little
//                                               endian) sends N bytes; ends when it closes.
//   podium-tcp-pump fetch ADDR PORT MAX_BYTES   connects, prints "ready"; per line N on stdin
//                                               sends the request, receives the N bytes and
//                                               prints the seconds from request to last byte.
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
    uint64_t n = std::stoull(line);
    if (n > max) return 2;
    auto t0 = std::chrono::steady_clock::now();
    if (!full(c, &n, sizeof n, true) || !full(c, data.data(), n, false)) die("transfer");
    std::chrono::duration<double> s = std::chrono::steady_clock::now() - t0;
    std::printf("%.9f\n", s.count());
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
