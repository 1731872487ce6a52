// Internal to podium_channel: the state one Net shares with its links, listeners and
// connections, and the small tools they all use. Not part of the public surface.
//
// Ownership: Net owns a shared_ptr<Core>; every link, listener and connection holds one too,
// and every pending Asio handler holds the object it completes on. Net::stop() clears the
// registries below, which breaks the Core -> object -> Core cycles; objects still referenced
// by pending handlers die when those run or when the io_context is destroyed.
#pragma once

#include <algorithm>
#include <asio/io_context.hpp>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <condition_variable>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "podium/base/clock_timer.h"
#include "podium/base/log.h"
#include "podium/channel/net.h"
#include "podium/channel/tls.h"

namespace podium::channel::internal {

using Clock = std::chrono::steady_clock;

class Link;
class Inbound;
struct Session;

// Counts callback sections (code that may call DeliverFn or UndeliverableFn) in flight, so
// that stop() can close the gate and wait until none runs. A section entered on a thread
// that then calls stop() does not wait for itself.
class Gate {
 public:
  class Scope {
   public:
    explicit Scope(Gate& g);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    explicit operator bool() const { return entered_; }

   private:
    friend class Gate;
    Gate& gate_;
    bool entered_;
    Scope* outer_;  // the enclosing scope on this thread
  };

  bool closed() const { return closed_.load(std::memory_order_acquire); }
  // Refuses new sections and waits for the running ones but the caller's own.
  void close_and_wait();

 private:
  std::atomic<uint32_t> active_{0};
  std::atomic<bool> closed_{false};
};

// An envelope a link holds until it is acknowledged, expires or is handed back.
struct Outgoing {
  uint64_t seq = 0;
  Clock::time_point deadline;
  wire::Envelope env;
};

// FIFO on a ring of 2^k slots: no allocation or element move per push/pop in steady state
// (it grows by doubling). Popped slots hold moved-from values until reused.
template <class T>
class Fifo {
 public:
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return slots_[(head_ + i) & (slots_.size() - 1)]; }
  T& front() { return slots_[head_]; }
  void push_back(T&& v) {
    if (size_ == slots_.size()) grow();
    (*this)[size_++] = std::move(v);
  }
  T pop_front() {
    T v = std::move(slots_[head_]);
    head_ = (head_ + 1) & (slots_.size() - 1);
    --size_;
    return v;
  }
  // Moves every element out, oldest first.
  void drain_into(std::vector<T>& out) {
    while (!empty()) out.push_back(pop_front());
  }

 private:
  void grow() {
    std::vector<T> bigger(std::max<size_t>(16, slots_.size() * 2));
    for (size_t i = 0; i < size_; ++i) bigger[i] = std::move((*this)[i]);
    slots_.swap(bigger);
    head_ = 0;
  }

  std::vector<T> slots_;
  size_t head_ = 0;
  size_t size_ = 0;
};

struct Core;

// Runs Core::batch_end on scope exit when something was delivered: one delivery batch (the
// frames of one read, the envelopes of one inproc drain) has ended, on every exit path.
struct BatchEnd {
  Core& core;
  bool delivered = false;
  ~BatchEnd();
};

// Something that accepts connections for a Net (a socket listener or an inproc name).
class ListenerBase {
 public:
  virtual ~ListenerBase() = default;
  virtual void close() = 0;
};

struct Core {
  // Parses config.tls (no I/O); a bad one leaves `tls` empty and says why in `tls_error`.
  Core(asio::io_context& io, Config config, DeliverFn deliver, UndeliverableFn undeliverable);

  asio::io_context& io;
  const Config config;
  // config.clock's time (the real clock when it is null): every deadline of the Net.
  Clock::time_point now() const { return base::now_of(config.clock); }
  const DeliverFn deliver;
  const UndeliverableFn undeliverable;
  // CH-9, set by the constructor, then only read: with config.tls enabled, either the parsed
  // context or why it could not be made (every TCP listen and connection then fails with it).
  std::shared_ptr<const TlsContext> tls;
  std::string tls_error;
  bool tls_enabled() const { return config.tls.enabled(); }
  // Net::on_batch_end(): set before the first listen() or send(), then only read.
  std::function<void()> batch_end;
  Gate gate;

  // CH-25: pulls of lent parts in flight for this Net's connections. Net::stop() closes
  // them, cancels their remaining chunks and waits until none runs, so that no pull posts
  // to the io_context or holds a connection after it. pull_mu is a leaf but for the
  // destructor of a connection its completion drops (which takes `mu`).
  std::mutex pull_mu;
  std::condition_variable pull_cv;
  size_t pulls_in_flight = 0;  // guarded by pull_mu
  bool pulls_closed = false;   // guarded by pull_mu
  const std::shared_ptr<std::atomic<bool>> pull_cancel = std::make_shared<std::atomic<bool>>(false);

  // CH-13..CH-15: what was refused (relaxed atomics: counters only), and one rate limit per
  // kind of warning a flood of bad peers could repeat (BL-2).
  struct Counters {
    std::atomic<uint64_t> refused_oversize{0}, refused_malformed{0}, refused_auth{0},
        handshake_timeouts{0}, unauthenticated_cap_hits{0}, setup_errors{0};
  } counters;
  // kLocal is not the peer's doing: this process could not run its side of the setup
  // (CH-18), counted in setup_errors.
  enum class Refusal : uint8_t { kNone, kOversize, kMalformed, kAuth, kTimeout, kLocal };
  void count(Refusal r);
  base::RateLimitedLog& warnings(Refusal r) { return warn_limits[static_cast<size_t>(r)]; }
  base::RateLimitedLog warn_limits[6];
  base::RateLimitedLog cap_warnings;     // CH-14
  base::RateLimitedLog accept_warnings;  // accept errors (EMFILE)
  base::RateLimitedLog link_warnings;    // a dialler's bad frames from a listener

  std::mutex mu;  // guards everything below
  bool stopped = false;
  std::string self_address;  // first listen address, sent in Hello for the peer's logs
  std::unordered_map<Address, std::shared_ptr<Link>> links;
  std::vector<std::shared_ptr<ListenerBase>> listeners;
  std::unordered_set<std::shared_ptr<Inbound>> inbounds;
  // Each connection by the listen address its peer named in Hello (the latest one per peer):
  // a send() to that address acknowledges what the connection has delivered (CH-10).
  std::unordered_map<Address, std::weak_ptr<Inbound>> inbound_by_peer;
  std::unordered_map<uint64_t, std::shared_ptr<Session>> sessions;
  // GW-2..GW-4: set by serve_as_gateway(): the address procs reach this gateway by, and the
  // routed addresses of the clients that attached through it (each a link in `links`).
  std::optional<Address> gateway;
  std::unordered_set<Address> routed;
  // GW-1, in a client: its duplex to Config::via, and where its (re)openings and failures go.
  std::shared_ptr<Link> duplex;
  std::function<void(Result<Address>)> via_event;
};

// GW-3: the header a client behind a gateway adds, last, to an envelope for another TCP
// address: its link to the gateway carries it, and the gateway takes it off and sends the
// envelope on to the address it names.
inline constexpr std::string_view kViaToHeader = "podium.via.to";

// Net::send() without the Net: a gateway sends what it forwards (GW-3) from inside its own
// read chain.
void net_send(const std::shared_ptr<Core>& core, const Address& to, wire::Envelope env);

// Hands each envelope back with `code` and `reason` (the caller has entered the gate, or is
// stop(), or is send() refusing).
void hand_back(Core& core, std::vector<Outgoing>& out, ChannelErrc code, const std::string& reason);

}  // namespace podium::channel::internal
