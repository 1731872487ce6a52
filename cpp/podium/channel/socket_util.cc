#include "podium/channel/socket_util.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "podium/channel/net.h"

namespace podium::channel::internal {
namespace {

std::unexpected<Error> listen_error(std::string msg) {
  return std::unexpected(make_error(ChannelErrc::kListenFailed, std::move(msg)));
}

}  // namespace

Endpoint unix_endpoint(const std::string& target) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  size_t len = std::min(target.size(), sizeof sa.sun_path - 1);  // Address::parse checked it
  std::memcpy(sa.sun_path, target.data(), len);
  if (target.starts_with('@')) sa.sun_path[0] = '\0';  // abstract: no NUL terminator counted
  size_t size = offsetof(sockaddr_un, sun_path) + len + (target.starts_with('@') ? 0 : 1);
  return Endpoint(&sa, size, 0);
}

Status prepare_unix_path(const std::string& path) {
  if (path.starts_with('@')) return ok();
  std::string dir = path.substr(0, path.rfind('/') == std::string::npos ? 0 : path.rfind('/'));
  if (!dir.empty()) {
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) {
      if (errno != ENOENT || ::mkdir(dir.c_str(), 0700) != 0) {
        return listen_error(errno_error("create socket directory " + dir, errno).message);
      }
    } else if (st.st_mode & 077) {
      spdlog::warn("channel: socket directory {} has mode {:o}; put sockets in a 0700 directory",
                   dir, st.st_mode & 0777);
    }
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return ok();
    return listen_error(errno_error("stat unix:" + path, errno).message);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return listen_error("unix:" + path + " exists and is not a socket");
  }
  // A socket file nobody accepts on is what a crashed listener leaves behind.
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return listen_error(errno_error("socket", errno).message);
  Endpoint ep = unix_endpoint(path);
  int rc = ::connect(fd, ep.data(), ep.size());
  int err = errno;
  ::close(fd);
  if (rc == 0) return listen_error("unix:" + path + " is in use by a live listener");
  if (err != ECONNREFUSED) return listen_error(errno_error("probe unix:" + path, err).message);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return listen_error(errno_error("remove stale unix:" + path, errno).message);
  }
  return ok();
}

Result<std::vector<Endpoint>> resolve_tcp(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) {
    return listen_error("resolve " + host + ": " + ::gai_strerror(rc));
  }
  std::vector<Endpoint> out;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    out.emplace_back(ai->ai_addr, ai->ai_addrlen, IPPROTO_TCP);
  }
  ::freeaddrinfo(res);
  return out;
}

ssize_t send_iov(int fd, const iovec* iov, size_t count) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = count;
  for (;;) {
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return -errno;
  }
}

void configure_stream(Socket& s, Transport t) {
  asio::error_code ec;
  s.native_non_blocking(true, ec);
  if (t == Transport::kTcp) {
    int one = 1;
    ::setsockopt(s.native_handle(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
}

std::string peer_name(Socket& s, Transport t) {
  if (t == Transport::kUnix) {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(s.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      return "unix peer pid " + std::to_string(cred.pid);
    }
    return "unix peer";
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (::getpeername(s.native_handle(), reinterpret_cast<sockaddr*>(&ss), &len) != 0 ||
      ::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "tcp peer";
  }
  bool v6 = std::strchr(host, ':') != nullptr;
  return std::string("tcp:") + (v6 ? "[" : "") + host + (v6 ? "]:" : ":") + serv;
}

}  // namespace podium::channel::internal
