// Internal to podium_channel: socket addresses and the few system calls Asio does not wrap
// the way the hot path needs.
#pragma once

#include <sys/uio.h>

#include <asio/generic/stream_protocol.hpp>
#include <string>
#include <vector>

#include "podium/base/error.h"
#include "podium/channel/address.h"

namespace podium::channel::internal {

using Socket = asio::generic::stream_protocol::socket;
using Endpoint = asio::generic::stream_protocol::endpoint;

// The endpoint of "unix:PATH" or "unix:@NAME" (abstract namespace).
Endpoint unix_endpoint(const std::string& target);

// Readies a Unix socket path for bind(): creates a missing parent directory with mode 0700
// (warns when an existing one is open to other users) and removes a stale socket file, one
// nobody accepts on. Refuses a live socket or a file that is not a socket.
[[nodiscard]] Status prepare_unix_path(const std::string& path);

// Resolves a TCP host synchronously (listen() only; links resolve asynchronously).
[[nodiscard]] Result<std::vector<Endpoint>> resolve_tcp(const std::string& host, uint16_t port);

// sendmsg(MSG_NOSIGNAL) of `iov`: bytes written, 0 when the socket buffer is full, or -errno.
ssize_t send_iov(int fd, const iovec* iov, size_t count);

// Puts an accepted or connected socket in the mode the links expect: non-blocking,
// TCP_NODELAY for TCP.
void configure_stream(Socket& s, Transport t);

// "tcp:10.0.0.2:41234" or "unix peer pid 1234", for logs.
std::string peer_name(Socket& s, Transport t);

}  // namespace podium::channel::internal
