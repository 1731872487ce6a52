// podium::data::BulkServer (tcp_bulk.h): the owner's TCP port. The reader's side is
// tcp_bulk_client.cc.
#include "podium/data/tcp_bulk.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <list>
#include <thread>

#include "podium/actor/busy_wait.h"
#include "podium/base/log.h"
#include "podium/channel/auth.h"
#include "podium/data/cma.h"
#include "podium/data/errc.h"
#include "podium/data/tcp_bulk_wire.h"

namespace podium::data {

namespace auth = channel::internal;
using Clock = std::chrono::steady_clock;

namespace {

using namespace bulk_wire;  // NOLINT: the wire's helpers

std::string reply_head(uint32_t status, uint64_t length) {
  std::string out(kBulkReplyBytes, '\0');
  auto* p = reinterpret_cast<std::byte*>(out.data());
  std::memcpy(p, kReplyMagic, 4);
  put_u32(p + 4, status);
  put_u64(p + 8, length);
  return out;
}

base::RateLimitedLog& warnings() {
  static auto* log = new base::RateLimitedLog();
  return *log;
}

}  // namespace

std::array<std::byte, kBulkRequestBytes> encode_request(const BulkRequest& r) {
  std::array<std::byte, kBulkRequestBytes> out{};
  std::memcpy(out.data(), kRequestMagic, 4);
  out[4] = static_cast<std::byte>(r.kind);
  put_u64(out.data() + 8, r.id);
  put_u64(out.data() + 16, r.offset);
  put_u64(out.data() + 24, r.length);
  std::memcpy(out.data() + 32, r.token.data(), std::min<size_t>(32, r.token.size()));
  return out;
}

std::optional<BulkRequest> decode_request(const std::byte* p) {
  if (std::memcmp(p, kRequestMagic, 4) != 0) return std::nullopt;
  auto kind = static_cast<uint8_t>(p[4]);
  if (kind != 1 && kind != 2) return std::nullopt;
  BulkRequest r;
  r.kind = static_cast<BulkKind>(kind);
  r.id = get_u64(p + 8);
  r.offset = get_u64(p + 16);
  r.length = get_u64(p + 24);
  r.token.assign(reinterpret_cast<const char*>(p + 32), 32);
  return r;
}

// --- the owner's server --------------------------------------------------------------------

struct BulkServer::Impl {
  enum class St { kChallenge, kResponse, kVerdict, kHeader, kReply, kData, kDiscard };
  struct Conn {
    UniqueFd fd;
    St st = St::kChallenge;
    bool proven = false;
    bool close_after_reply = false;  // a refused proof: the verdict, then close
    Clock::time_point since;          // accepted, or the last progress inside a request
    auth::Nonce server_nonce{}, client_nonce{};
    std::array<std::byte, kBulkRequestBytes> in{};
    size_t in_len = 0, in_want = 0;
    std::string out;  // a reply head (and message), the challenge, the verdict
    size_t out_off = 0;
    BulkRequest req;
    std::shared_ptr<Registration> reg;  // held while its request moves bytes
    bool counted = false;               // DA-46
    std::byte* data = nullptr;
    uint64_t left = 0;
    std::optional<Error> refusal;  // a put refused: told once its bytes were discarded
    uint32_t interest = 0;
    std::string peer;
  };

  Config config;
  BufferTable& table;
  UniqueFd listener, epoll, wake;
  std::thread thread;
  std::atomic<bool> stopping{false};
  std::list<Conn> conns;  // the thread's own
  std::optional<Clock::time_point> accept_paused_until;  // the thread's own: out of fds
  std::unordered_map<int, std::list<Conn>::iterator> by_fd;
  size_t active = 0;  // the thread's own: requests counted in flight (DA-46), of every buffer
  std::vector<std::byte> scratch = std::vector<std::byte>(size_t{256} << 10);

  mutable std::mutex mu;
  std::unordered_map<uint64_t, size_t> inflight;                           // guarded by mu
  std::unordered_map<uint64_t, std::vector<std::function<void()>>> idle;  // guarded by mu

  std::atomic<uint64_t> accepted{0}, authenticated{0}, refused_auth{0}, requests{0},
      refused{0}, bytes{0}, open{0};

  Impl(Config c, BufferTable& t) : config(std::move(c)), table(t) {}

  void count(uint64_t id) {
    ++active;
    std::lock_guard lock(mu);
    ++inflight[id];
  }
  void uncount(Conn& c) {
    if (!c.counted) return;
    c.counted = false;
    --active;
    c.reg.reset();
    std::vector<std::function<void()>> run;
    {
      std::lock_guard lock(mu);
      auto it = inflight.find(c.req.id);
      if (it != inflight.end() && --it->second == 0) {
        inflight.erase(it);
        auto w = idle.find(c.req.id);
        if (w != idle.end()) {
          run = std::move(w->second);
          idle.erase(w);
        }
      }
    }
    for (auto& f : run) f();
  }

  void watch(Conn& c, uint32_t events) {
    if (c.interest == events) return;
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = c.fd.get();
    ::epoll_ctl(epoll.get(), c.interest == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c.fd.get(), &ev);
    c.interest = events;
  }

  void close(std::list<Conn>::iterator it, const std::string& why) { close(it, why.c_str()); }
  void close(std::list<Conn>::iterator it, const char* why) {
    if (why != nullptr) {
      warnings().warn("podium data: closed the TCP bulk connection from {}: {}", it->peer, why);
    }
    uncount(*it);
    ::epoll_ctl(epoll.get(), EPOLL_CTL_DEL, it->fd.get(), nullptr);
    by_fd.erase(it->fd.get());
    conns.erase(it);
    --open;
  }

  void accept_all() {
    for (;;) {
      sockaddr_storage sa{};
      socklen_t len = sizeof sa;
      int fd = ::accept4(listener.get(), reinterpret_cast<sockaddr*>(&sa), &len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors: the listener stays readable, so level-triggered epoll would
          // spin on it. It rests 100 ms instead (as the control plane's, CH-14).
          warnings().warn("podium data: the TCP bulk server cannot accept ({}); retrying in "
                          "100 ms", std::strerror(errno));
          epoll_event ev{};
          ev.data.fd = listener.get();
          ::epoll_ctl(epoll.get(), EPOLL_CTL_MOD, listener.get(), &ev);
          accept_paused_until = Clock::now() + std::chrono::milliseconds(100);
        }
        return;  // EAGAIN: all accepted
      }
      ++accepted;
      char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
      ::getnameinfo(reinterpret_cast<sockaddr*>(&sa), len, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV);
      // DA-45: at most kMaxUnauthenticated unproven connections; the oldest goes.
      size_t unproven = 0;
      auto oldest = conns.end();
      for (auto it = conns.begin(); it != conns.end(); ++it) {
        if (it->proven) continue;
        ++unproven;
        if (oldest == conns.end() || it->since < oldest->since) oldest = it;
      }
      if (unproven >= kMaxUnauthenticated && oldest != conns.end()) {
        ++refused_auth;
        close(oldest, "too many connections that have not proved the job's secret");
      }
      conns.emplace_back();
      auto it = std::prev(conns.end());
      it->fd = UniqueFd(fd);
      it->peer = std::string(host) + ":" + port;
      it->since = Clock::now();
      by_fd[fd] = it;
      ++open;
      set_nodelay(fd);
      auto nonce = auth::random_nonce();
      if (!nonce) {
        close(it, "no random bytes for the challenge");
        continue;
      }
      it->server_nonce = *nonce;
      auto ch = auth::auth_challenge(*nonce);
      it->out.assign(reinterpret_cast<const char*>(ch.data()), ch.size());
      it->out_off = 0;
      it->st = St::kChallenge;
      drive(it);
    }
  }

  // The next request: reads its 64 bytes.
  void await_header(Conn& c) {
    c.st = St::kHeader;
    c.in_len = 0;
    c.in_want = kBulkRequestBytes;
    c.since = Clock::now();
  }

  // A whole request arrived: checks it (DA-45, DA-46) and starts its answer.
  void start_request(Conn& c) {
    c.req = *decode_request(c.in.data());
    bool put = c.req.kind == BulkKind::kPut;
    count(c.req.id);  // DA-46: before the check, so that a drop after it waits for us
    c.counted = true;
    Status st;
    auto reg = table.acquire(c.req.id, c.req.token, put);
    if (!reg) {
      st = std::unexpected(reg.error());
    } else if (c.req.offset > (*reg)->size() || c.req.length > (*reg)->size() - c.req.offset) {
      st = std::unexpected(make_error(
          DataErrc::kInvalidArgument,
          "bytes " + std::to_string(c.req.offset) + " to " +
              std::to_string(c.req.offset + c.req.length) + " lie outside buffer " +
              std::to_string(c.req.id) + " of " + std::to_string((*reg)->size()) + " bytes"));
    }
    ++requests;
    if (!st) {
      ++refused;
      uncount(c);
      if (put) {
        c.refusal = st.error();
        c.st = St::kDiscard;
        c.left = c.req.length;
      } else {
        answer_error(c, st.error());
      }
      return;
    }
    c.reg = std::move(*reg);
    c.data = reinterpret_cast<std::byte*>(c.reg->addr()) + c.req.offset;
    c.left = c.req.length;
    if (put) {
      c.st = St::kData;
    } else {
      c.out = reply_head(0, c.req.length);
      c.out_off = 0;
      c.st = St::kReply;
    }
  }

  void answer_error(Conn& c, const Error& e) {
    std::string msg = e.message.substr(0, kMaxBulkMessage);
    c.out = reply_head((static_cast<uint32_t>(e.subsystem) << 16) | e.code, msg.size()) + msg;
    c.out_off = 0;
    c.left = 0;
    c.data = nullptr;
    c.st = St::kReply;
  }

  // Moves what the socket takes or gives now; false when the connection was closed.
  bool drive(std::list<Conn>::iterator it) {
    Conn& c = *it;
    size_t moved = 0;
    for (;;) {
      switch (c.st) {
        case St::kChallenge:
        case St::kVerdict:
        case St::kReply: {
          // Writes c.out, then (a get) c.left bytes from c.data.
          iovec iov[2];
          int n = 0;
          if (c.out_off < c.out.size()) {
            iov[n++] = {c.out.data() + c.out_off, c.out.size() - c.out_off};
          }
          if (c.st == St::kReply && c.left > 0) {
            iov[n++] = {c.data, static_cast<size_t>(std::min<uint64_t>(c.left, config.turn_bytes))};
          }
          if (n == 0) {
            if (c.st == St::kChallenge) {
              c.st = St::kResponse;
              c.in_len = 0;
              c.in_want = auth::kResponseBytes;
            } else if (c.st == St::kVerdict) {
              if (c.close_after_reply) {
                ++refused_auth;
                close(it, "the peer did not prove the job's secret");
                return false;
              }
              c.proven = true;
              ++authenticated;
              await_header(c);
            } else {
              uncount(c);  // DA-46: the last byte left
              await_header(c);
            }
            continue;
          }
          if (moved >= config.turn_bytes) {
            // The others' turn (bytes are left to write: epoll brings this one back).
            watch(c, EPOLLOUT);
            return true;
          }
          msghdr mh{};
          mh.msg_iov = iov;
          mh.msg_iovlen = static_cast<size_t>(n);
          ssize_t w = ::sendmsg(c.fd.get(), &mh, MSG_NOSIGNAL);
          if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
              watch(c, EPOLLOUT);
              return true;
            }
            if (errno == EINTR) continue;
            close(it, nullptr);  // the reader went away (or cancelled: DA-47)
            return false;
          }
          size_t wrote = static_cast<size_t>(w);
          size_t head = std::min(wrote, c.out.size() - c.out_off);
          c.out_off += head;
          wrote -= head;
          c.data += wrote;
          c.left -= wrote;
          bytes += wrote;
          moved += static_cast<size_t>(w);
          c.since = Clock::now();
          continue;
        }
        case St::kResponse:
        case St::kHeader: {
          ssize_t r = ::recv(c.fd.get(), c.in.data() + c.in_len, c.in_want - c.in_len, 0);
          if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            close(it, nullptr);
            return false;
          }
          if (r < 0) {
            if (errno == EINTR) continue;
            watch(c, EPOLLIN);
            return true;
          }
          c.in_len += static_cast<size_t>(r);
          c.since = Clock::now();  // DA-45: a stall counts from the last byte of a request
          if (c.in_len < c.in_want) continue;
          if (c.st == St::kResponse) {
            auto ok = auth::verify_response(
                config.secret, c.server_nonce,
                std::span(reinterpret_cast<const uint8_t*>(c.in.data()), c.in_len),
                c.client_nonce);
            bool accepted = ok && *ok;
            auto verdict = auth::auth_verdict(accepted, config.secret, c.client_nonce,
                                              c.server_nonce);
            if (!verdict) {
              close(it, "the verdict could not be made (OpenSSL)");
              return false;
            }
            c.out.assign(reinterpret_cast<const char*>(verdict->data()), verdict->size());
            c.out_off = 0;
            c.close_after_reply = !accepted;
            c.st = St::kVerdict;
            continue;
          }
          if (!decode_request(c.in.data())) {
            close(it, "a malformed request");
            return false;
          }
          start_request(c);
          continue;
        }
        case St::kData:
        case St::kDiscard: {
          if (c.left == 0) {
            if (c.st == St::kData) {
              uncount(c);  // DA-46: the last byte arrived
              c.out = reply_head(0, 0);
              c.out_off = 0;
              c.st = St::kReply;
            } else {
              answer_error(c, *c.refusal);
              c.refusal.reset();
            }
            continue;
          }
          if (moved >= config.turn_bytes) {
            // The others' turn (bytes are left to read: epoll brings this one back). Checked
            // only here, with bytes left: a request whose last byte ended a turn is answered
            // now, not after an event that will never come.
            watch(c, EPOLLIN);
            return true;
          }
          std::byte* into = c.st == St::kData ? c.data : scratch.data();
          size_t want = c.st == St::kData ? std::min<uint64_t>(c.left, config.turn_bytes)
                                          : std::min<uint64_t>(c.left, scratch.size());
          ssize_t r = ::recv(c.fd.get(), into, want, 0);
          if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            close(it, nullptr);
            return false;
          }
          if (r < 0) {
            if (errno == EINTR) continue;
            watch(c, EPOLLIN);
            return true;
          }
          if (c.st == St::kData) {
            c.data += r;
            bytes += static_cast<uint64_t>(r);
          }
          c.left -= static_cast<uint64_t>(r);
          moved += static_cast<size_t>(r);
          c.since = Clock::now();
          continue;
        }
      }
    }
  }

  // DA-45: closes connections that did not prove the secret in time, or stalled in a request.
  void sweep() {
    auto now = Clock::now();
    for (auto it = conns.begin(); it != conns.end();) {
      auto next = std::next(it);
      if (!it->proven && now - it->since > auth::kAuthTimeout) {
        ++refused_auth;
        close(it, "it did not prove the job's secret within 10 s");
      } else if (it->proven && (it->st != St::kHeader || it->in_len > 0) &&
                 now - it->since > config.stall_timeout) {
        close(it, "no progress inside a request for " +
                      std::to_string(config.stall_timeout.count()) + " ms");
      }
      it = next;
    }
  }

  void run() {
    pthread_setname_np(pthread_self(), "podium-tcp");
    cma::lower_priority(config.nice);  // DA-11
    epoll_event events[64];
    // DA-53: after an event, poll without sleeping until `spin` passed with none.
    auto spin = config.spin.count() < 0 ? BulkServer::default_spin() : config.spin;
    Clock::time_point spin_until{};
    bool in_spin = false;
    auto& guard = actor::BusyWaitGuard::mine();
    while (!stopping.load()) {
      // Only between requests: inside one the socket's pace rules, and a spin would take
      // the CPU that the network stack needs to move the bytes. As every busy-wait of
      // podium's (actor/busy_wait.h): only with a core to spare, and it ends as soon as it
      // sees it lost its core (AC-19, AC-20): a reader polling on the same core would
      // otherwise wait out this thread's time slice.
      auto now = Clock::now();
      bool spinning = false;
      if (spin.count() > 0 && active == 0 && now < spin_until) {
        if (!in_spin) {
          in_spin = guard.may_start(now);
          if (in_spin) guard.start(now);
        } else if (!guard.check(now)) {
          in_spin = false;
        }
        spinning = in_spin;
        if (!spinning) spin_until = {};
      } else {
        in_spin = false;
      }
      int n = ::epoll_wait(epoll.get(), events, 64,
                           spinning ? 0 : accept_paused_until ? 100 : 1000);
      if (n > 0 && spin.count() > 0) spin_until = Clock::now() + spin;
      if (accept_paused_until && Clock::now() >= *accept_paused_until) {
        accept_paused_until.reset();
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = listener.get();
        ::epoll_ctl(epoll.get(), EPOLL_CTL_MOD, listener.get(), &ev);
      }
      for (int i = 0; i < n; ++i) {
        int fd = events[i].data.fd;
        if (fd == listener.get()) {
          accept_all();
        } else if (fd == wake.get()) {
          uint64_t v;
          (void)!::read(wake.get(), &v, sizeof v);
        } else {
          auto it = by_fd.find(fd);
          if (it != by_fd.end()) drive(it->second);
        }
      }
      sweep();
    }
    while (!conns.empty()) close(conns.begin(), nullptr);
  }
};

Result<std::unique_ptr<BulkServer>> BulkServer::start(Config config, BufferTable& table) {
  auto impl = std::make_unique<Impl>(std::move(config), table);
  sockaddr_storage sa{};
  socklen_t len = 0;
  std::string host = impl->config.host;
  if (!parse_address((host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":0", sa,
                     len)) {
    return std::unexpected(make_error(DataErrc::kInvalidArgument,
                                      "the TCP bulk server cannot listen on '" + host +
                                          "': not a numeric address"));
  }
  impl->listener = UniqueFd(::socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!impl->listener) return std::unexpected(errno_error("socket", errno));
  if (::bind(impl->listener.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    return std::unexpected(errno_error("bind " + host, errno));
  }
  if (::listen(impl->listener.get(), 128) != 0) return std::unexpected(errno_error("listen", errno));
  sockaddr_storage bound{};
  socklen_t blen = sizeof bound;
  ::getsockname(impl->listener.get(), reinterpret_cast<sockaddr*>(&bound), &blen);
  char h[NI_MAXHOST], p[NI_MAXSERV];
  ::getnameinfo(reinterpret_cast<sockaddr*>(&bound), blen, h, sizeof h, p, sizeof p,
                NI_NUMERICHOST | NI_NUMERICSERV);
  std::string shown = std::string(h).find(':') != std::string::npos ? "[" + std::string(h) + "]"
                                                                    : std::string(h);
  impl->epoll = UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
  impl->wake = UniqueFd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!impl->epoll || !impl->wake) return std::unexpected(errno_error("epoll/eventfd", errno));
  for (int fd : {impl->listener.get(), impl->wake.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    ::epoll_ctl(impl->epoll.get(), EPOLL_CTL_ADD, fd, &ev);
  }
  auto* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  std::unique_ptr<BulkServer> server(new BulkServer(std::move(impl)));
  server->address_ = shown + ":" + p;
  return server;
}

std::chrono::microseconds BulkServer::default_spin() {
  static const std::chrono::microseconds spin = [] {
    const char* env = std::getenv("PODIUM_RDMA_TCP_SERVER_SPIN_US");
    if (env == nullptr || *env == '\0') return kDefaultServerSpin;
    return std::chrono::microseconds(std::max(0L, std::strtol(env, nullptr, 10)));
  }();
  return spin;
}

BulkServer::BulkServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BulkServer::~BulkServer() { stop(); }

void BulkServer::stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  uint64_t one = 1;
  (void)!::write(impl_->wake.get(), &one, sizeof one);
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->listener.reset();  // a stopped server accepts nothing: dialers are refused at once
}

void BulkServer::after_idle(uint64_t id, std::function<void()> then) {
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->inflight.count(id) != 0) {
      impl_->idle[id].push_back(std::move(then));
      return;
    }
  }
  then();
}

BulkServer::Stats BulkServer::stats() const {
  return Stats{impl_->accepted.load(), impl_->authenticated.load(), impl_->refused_auth.load(),
               impl_->requests.load(),  impl_->refused.load(),       impl_->bytes.load(),
               impl_->open.load()};
}

}  // namespace podium::data
