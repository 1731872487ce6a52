// podium::data::BulkPool and BulkCall (tcp_bulk.h): the reader's requests to an owner's TCP
// bulk server (tcp_bulk.cc).
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "podium/actor/busy_wait.h"
#include "podium/channel/auth.h"
#include "podium/data/errc.h"
#include "podium/data/tcp_bulk.h"
#include "podium/data/tcp_bulk_wire.h"

namespace podium::data {

namespace auth = channel::internal;
using Clock = std::chrono::steady_clock;
using namespace bulk_wire;  // NOLINT: the wire's helpers

// --- the reader's side ---------------------------------------------------------------------

namespace {

// A kept connection whose owner closed it (or sent what no request asked for): readable
// between requests.
bool closed_by_peer(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;
}

}  // namespace

UniqueFd BulkPool::take(const std::string& address) {
  std::lock_guard lock(mu_);
  auto it = idle_.find(address);
  while (it != idle_.end() && !it->second.empty()) {
    UniqueFd fd = std::move(it->second.back());
    it->second.pop_back();
    if (!closed_by_peer(fd.get())) return fd;
  }
  return UniqueFd();
}

void BulkPool::give(const std::string& address, UniqueFd fd) {
  std::lock_guard lock(mu_);
  auto now = Clock::now();
  if (now - pruned_ >= std::chrono::seconds(1)) {
    pruned_ = now;
    for (auto it = idle_.begin(); it != idle_.end();) {
      auto& kept = it->second;
      std::erase_if(kept, [](const UniqueFd& f) { return closed_by_peer(f.get()); });
      it = kept.empty() ? idle_.erase(it) : std::next(it);
    }
  }
  auto& kept = idle_[address];
  if (kept.size() < kKeptPerAddress) kept.push_back(std::move(fd));
}

void BulkPool::forget_after_fork() {
  new (&mu_) std::mutex();  // another thread of the parent may have held it at the fork
  idle_.clear();            // closes the child's copies; the parent's stay open
}

size_t BulkPool::idle() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [_, v] : idle_) n += v.size();
  return n;
}

BulkCall::BulkCall(BulkPool& pool, std::string address, BulkRequest request, std::byte* local,
                   Clock::time_point deadline, Gone gone)
    : pool_(pool),
      address_(std::move(address)),
      request_(std::move(request)),
      local_(local),
      deadline_(deadline),
      gone_(std::move(gone)) {}

BulkCall::~BulkCall() = default;

Clock::duration BulkPool::default_spin() {
  static const Clock::duration spin = [] {
    const char* env = std::getenv("PODIUM_RDMA_TCP_SPIN_US");
    long us = env != nullptr && *env != '\0' ? std::strtol(env, nullptr, 10)
                                              : static_cast<long>(kDefaultTcpSpin.count());
    return std::chrono::duration_cast<Clock::duration>(std::chrono::microseconds(std::max(0L, us)));
  }();
  return spin;
}

bool BulkCall::fail(Error e) {
  fd_.reset();  // DA-47: closing cancels the request at the owner
  status_ = std::unexpected(std::move(e));
  phase_ = Phase::kDone;
  return true;
}

bool BulkCall::fail_io(std::string_view what, int err) {
  std::string why = err == 0 ? "the owner closed the connection"
                             : std::string(std::strerror(err));
  return fail(make_error(DataErrc::kTransferFailed, "TCP bulk " + std::string(what) + " " +
                                                        address_ + ": " + why));
}

bool BulkCall::wait(short events, Clock::time_point until, bool* late) {
  for (;;) {
    auto now = Clock::now();
    if (now >= deadline_) {
      fail(make_error(DataErrc::kTimeout, "the TCP bulk request to " + address_ +
                                              " did not finish within its timeout"));
      return false;
    }
    if (now >= until) {
      *late = true;
      return false;
    }
    if (gone_) {
      if (auto e = gone_()) {  // RD-2: the runtime knows the owner's proc ended
        fail(std::move(*e));
        return false;
      }
    }
    auto slice = std::min({until - now, deadline_ - now,
                           std::chrono::duration_cast<Clock::duration>(kPollSlice)});
    int ms = static_cast<int>(
        std::max<int64_t>(1, std::chrono::ceil<std::chrono::milliseconds>(slice).count()));
    pollfd p{fd_.get(), events, 0};
    // DA-50: a short spin before the sleep, so that a reply that comes within it is taken
    // without the wake-up of a thread, and of its CPU, that went to sleep.
    // Only while no byte of the reply came yet (or while dialing): once bytes flow, what
    // comes next comes at the pace of the link, and a spin would only take the CPU that the
    // network stack and the owner need (on 2 cores, 256 KiB reads went from 60% to 50% of
    // raw TCP).
    // As every busy-wait of podium's (actor/busy_wait.h): only with a core to spare, and it
    // ends as soon as it sees it lost its core (AC-19, AC-20).
    auto spin = pool_.spin();
    bool first_byte = phase_ == Phase::kDial || (phase_ == Phase::kReply && done_ == 0);
    auto& guard = actor::BusyWaitGuard::mine();
    if (first_byte && spin > Clock::duration::zero() && spun_ < spin &&
        guard.may_start(now)) {
      auto t0 = Clock::now();
      guard.start(t0);
      int r = 0;
      while ((r = ::poll(&p, 1, 0)) == 0) {
        auto t = Clock::now();
        if (t - t0 >= spin - spun_ || !guard.check(t)) break;
      }
      spun_ += Clock::now() - t0;
      if (r > 0) return true;
    }
    int r = ::poll(&p, 1, ms);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) {
      fail_io("poll on", errno);
      return false;
    }
  }
}

bool BulkCall::dial(Clock::time_point until, bool* late) {
  sockaddr_storage sa{};
  socklen_t len = 0;
  if (!parse_address(address_, sa, len)) {
    fail(make_error(DataErrc::kInvalidArgument, "bad TCP bulk address '" + address_ + "'"));
    return false;
  }
  fd_ = UniqueFd(::socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd_) return !fail_io("socket for", errno);
  if (::connect(fd_.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0 && errno != EINPROGRESS) {
    return !fail_io("connect to", errno);
  }
  // The handshake is bounded by the deadline and kAuthTimeout, not by `until`: it is made
  // once per connection (DA-47).
  auto bound = std::min(deadline_, Clock::now() + auth::kAuthTimeout);
  (void)until;
  if (!wait(POLLOUT, bound, late)) {
    if (*late) return !fail_io("connect (no answer within 10 s) to", ETIMEDOUT);
    return false;
  }
  int err = 0;
  socklen_t elen = sizeof err;
  ::getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &elen);
  if (err != 0) return !fail_io("connect to", err);
  set_nodelay(fd_.get());
  auto exchange = [&](void* buf, size_t n, bool reading) -> bool {
    size_t got = 0;
    while (got < n) {
      if (!wait(reading ? POLLIN : POLLOUT, bound, late)) {
        if (*late) return !fail_io("handshake (no answer within 10 s) with", ETIMEDOUT);
        return false;
      }
      ssize_t r = reading ? ::recv(fd_.get(), static_cast<char*>(buf) + got, n - got, 0)
                          : ::send(fd_.get(), static_cast<char*>(buf) + got, n - got,
                                   MSG_NOSIGNAL);
      if (r == 0 && reading) return !fail_io("handshake with", 0);
      if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        return !fail_io("handshake with", errno);
      }
      got += static_cast<size_t>(r);
    }
    return true;
  };
  std::array<uint8_t, auth::kChallengeBytes> challenge{};
  if (!exchange(challenge.data(), challenge.size(), true)) return false;
  auth::Nonce server_nonce{};
  if (!auth::parse_challenge(challenge, server_nonce)) {
    fail(make_error(DataErrc::kTransferFailed,
                    "TCP bulk port " + address_ + " is not a podium data port"));
    return false;
  }
  auto client_nonce = auth::random_nonce();
  if (!client_nonce) return !fail(client_nonce.error());
  auto response = auth::auth_response(pool_.secret(), server_nonce, *client_nonce);
  if (!response) return !fail(response.error());
  if (!exchange(response->data(), response->size(), false)) return false;
  auth::VerdictBytes verdict{};
  if (!exchange(verdict.data(), verdict.size(), true)) return false;
  auto v = auth::check_verdict(pool_.secret(), *client_nonce, server_nonce, verdict);
  if (!v) return !fail(v.error());
  if (*v != auth::Verdict::kAccepted) {
    fail(make_error(DataErrc::kRefused,
                    *v == auth::Verdict::kRefused
                        ? "the owner's TCP bulk port " + address_ +
                              " refused this process's proof of the job's secret"
                        : "the TCP bulk port " + address_ +
                              " did not prove that it holds the job's secret"));
    return false;
  }
  return true;
}

bool BulkCall::advance(Clock::time_point until) {
  bool late = false;
  while (phase_ != Phase::kDone) {
    switch (phase_) {
      case Phase::kDial: {
        fd_ = pool_.take(address_);
        if (!fd_ && !dial(until, &late)) return phase_ == Phase::kDone;
        head_ = encode_request(request_);
        done_ = 0;
        phase_ = Phase::kSend;
        break;
      }
      case Phase::kSend: {
        // The request, then a put's bytes.
        size_t total = kBulkRequestBytes +
                       (request_.kind == BulkKind::kPut ? request_.length : uint64_t{0});
        if (done_ == total) {
          done_ = 0;
          phase_ = Phase::kReply;
          break;
        }
        iovec iov[2];
        int n = 0;
        if (done_ < kBulkRequestBytes) {
          iov[n++] = {head_.data() + done_, kBulkRequestBytes - done_};
        }
        if (request_.kind == BulkKind::kPut && request_.length > 0) {
          size_t off = done_ > kBulkRequestBytes ? done_ - kBulkRequestBytes : 0;
          iov[n++] = {local_ + off, static_cast<size_t>(request_.length - off)};
        }
        msghdr mh{};
        mh.msg_iov = iov;
        mh.msg_iovlen = static_cast<size_t>(n);
        ssize_t w = ::sendmsg(fd_.get(), &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            if (!wait(POLLOUT, until, &late)) return phase_ == Phase::kDone;
            break;
          }
          return fail_io("send to", errno);
        }
        done_ += static_cast<size_t>(w);
        break;
      }
      case Phase::kReply:
      case Phase::kMessage:
      case Phase::kData: {
        std::byte* into = nullptr;
        size_t want = 0;
        if (phase_ == Phase::kReply) {
          into = reply_.data() + done_;
          want = kBulkReplyBytes - done_;
        } else if (phase_ == Phase::kMessage) {
          into = reinterpret_cast<std::byte*>(message_.data()) + done_;
          want = message_.size() - done_;
        } else {
          into = local_ + done_;
          want = length_ - done_;
        }
        if (want == 0) {
          if (phase_ == Phase::kReply) {
            if (std::memcmp(reply_.data(), kReplyMagic, 4) != 0) {
              return fail(make_error(DataErrc::kTransferFailed,
                                     "a malformed reply from TCP bulk port " + address_));
            }
            code_ = get_u32(reply_.data() + 4);
            length_ = get_u64(reply_.data() + 8);
            done_ = 0;
            if (code_ != 0) {
              if (length_ > kMaxBulkMessage) {
                return fail(make_error(DataErrc::kTransferFailed,
                                       "a malformed reply from TCP bulk port " + address_));
              }
              message_.assign(length_, '\0');
              phase_ = Phase::kMessage;
            } else if (request_.kind == BulkKind::kGet) {
              if (length_ != request_.length) {
                return fail(make_error(DataErrc::kTransferFailed,
                                       "TCP bulk port " + address_ + " answered " +
                                           std::to_string(length_) + " bytes for " +
                                           std::to_string(request_.length)));
              }
              phase_ = Phase::kData;
            } else {
              phase_ = Phase::kDone;  // a put's acknowledgement
            }
          } else {
            phase_ = Phase::kDone;
          }
          if (phase_ == Phase::kDone) {
            pool_.give(address_, std::move(fd_));  // DA-47: between requests only
            if (code_ != 0) {
              status_ = std::unexpected(
                  Error{static_cast<Subsystem>(code_ >> 16), static_cast<uint16_t>(code_), message_});
            }
          }
          break;
        }
        if (phase_ == Phase::kReply && done_ == 0 && !waited_) {
          // The reply cannot be there yet: wait first, and save a system call.
          waited_ = true;
          if (!wait(POLLIN, until, &late)) return phase_ == Phase::kDone;
        }
        ssize_t r = ::recv(fd_.get(), into, want, MSG_DONTWAIT);
        if (r == 0) return fail_io("reply from", 0);
        if (r < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            if (!wait(POLLIN, until, &late)) return phase_ == Phase::kDone;
            break;
          }
          return fail_io("reply from", errno);
        }
        done_ += static_cast<size_t>(r);
        break;
      }
      case Phase::kDone:
        break;
    }
  }
  return true;
}

}  // namespace podium::data
