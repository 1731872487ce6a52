// podium::channel::Net — a proc's reliable, ordered links to other procs.
//
// One Net per proc. It listens on one or more Addresses and keeps one outgoing link per
// destination Address. Each link is a reliable ordered session over any transport (inproc,
// Unix socket, TCP): the sender numbers envelopes, the receiver acknowledges cumulatively and
// drops duplicates, a broken connection is re-dialled with backoff and everything not yet
// acknowledged is sent again. An envelope that cannot be delivered within
// Config::delivery_timeout is handed back through the UndeliverableFn with the reason.
//
// Threads: the caller owns the asio::io_context and runs it on one or more threads; the Net is
// correct however many threads run it. The io_context must outlive the Net. send(), listen()
// and stop() are thread-safe. DeliverFn runs on io_context threads. UndeliverableFn runs on
// io_context threads, with two exceptions that run it on the calling thread before returning:
// stop() hands back what is queued, and send() hands back an envelope it refuses outright
// (the Net is stopped, or the envelope exceeds max_frame_bytes or max_parts). Once stop()
// returns, no DeliverFn or UndeliverableFn call is running or will start (except the one
// that called stop(), if any).
//
// Invariants (tests name them):
//   CH-1 Per (sending Net, destination Address), envelopes are delivered in send() order.
//   CH-2 Each envelope is delivered at most once, across reconnects and resends.
//   CH-3 Each envelope is either delivered or handed to UndeliverableFn, never silently lost
//        (stop() hands back what is still queued with a kCancelled error). An envelope handed
//        back after it was written may still have been delivered: its ack was not seen.
//   CH-4 DeliverFn calls for one incoming link never run concurrently.
//   CH-5 A malformed, truncated or oversized frame closes only its own connection, with a
//        logged reason; the Net keeps serving its other connections.
//   CH-6 send() never blocks on the network; when the link is connected and idle it writes on
//        the caller's thread (one writev, no thread hop), otherwise the io_context finishes.
//   CH-7 A send made under FlushLater is written with the link's next write, or once
//        kFlushLaterFrames are waiting, or at the latest Config::flush_later_delay after it
//        was queued (a timer on the io_context): a burst costs one writev, and no envelope
//        waits for a later send that may never come.
//   CH-8 With Config::secret set, a TCP connection carries frames only after both ends
//        proved the secret (auth.h): a listener decodes nothing from a peer that did not,
//        and refuses it at once with a logged warning; a dialler whose secret is refused
//        hands its queued envelopes back with kAuthFailed at once.
//   CH-9 With Config::tls set, a TCP connection runs TLS 1.3 with a certificate on both sides,
//        each checked against the configured CA, before anything else (the CH-8 exchange
//        included): a listener decodes nothing from a peer that did not complete it. A peer
//        whose certificate is refused, or that speaks TLS to a plaintext Net or plaintext to
//        a TLS one, is refused within one round trip: the listener logs a warning naming the
//        peer and OpenSSL's reason, and the dialler hands its queued envelopes back with
//        kTlsFailed. Unix and in-process links stay plaintext.
//   CH-10 A send to an address acknowledges, right after its own write, everything the
//        connection from the Net listening there (named by its Hello) has delivered, once
//        the oldest of it has waited Config::ack_with_send_after, and disarms that
//        connection's delayed-ack timer: requests and replies carry each other's acks, so
//        neither end wakes again for an ack timer or for reading an ack later.
//   CH-13 Every inbound socket connection (Unix or TCP, with or without a secret or TLS)
//        that has not completed its handshake (authentication, TLS and Hello) within
//        Config::handshake_timeout is closed, with a logged reason and
//        NetStats::handshake_timeouts counted: a peer that connects and says nothing, or half
//        a Hello, holds nothing for longer.
//   CH-14 Each listener holds at most Config::max_unauthenticated connections that have not
//        completed their handshake. At the cap, the oldest of them that has proved nothing
//        yet (no secret, no TLS, no Hello) is closed for the new one; when all have proved
//        something, the new one is closed at once (both counted in
//        NetStats::unauthenticated_cap_hits, logged rate-limited). So a flood of half-open
//        connections costs at most the cap in memory and descriptors, and cannot keep out a
//        real peer, which proves itself within a round trip. The accept loop survives EMFILE
//        (it retries after 100 ms).
//   CH-15 A peer's frame is refused for a claimed length over the limits (WI-5) before
//        anything is allocated for it, and the connection's memory grows only with the bytes
//        that arrived (WI-6): a peer announcing a 2 GiB header or part costs what it sent.
//        Each refusal is counted in NetStats (refused_oversize, refused_malformed,
//        refused_auth) and its CH-5 warning is rate-limited per kind (base/log.h, BL-2).
//   CH-16 A Unix-socket connection whose peer runs as another user (SO_PEERCRED; root
//        excepted) is closed at accept, counted in NetStats::refused_auth: the abstract
//        namespace (unix:@NAME) has no file permissions to keep other users out.
//   CH-25 On a Unix-socket link whose receiver proved at the handshake that it can read the
//        sender's memory (it reads the Hello's probe with process_vm_readv from the pid the
//        kernel names, SO_PEERCRED), a part of at least Config::lend_min_bytes is lent, not
//        written (WI-8): the receiver pulls it off its io threads into an allocation of its
//        own (a received Buffer, BU-1), then delivers the envelope, in order: later envelopes
//        of that link wait behind the pull, those of other links do not. A receiver that
//        cannot read the probe (EPERM, another pid namespace, Config::pull_lent off) gets
//        every part inline; a pull that fails closes the connection with a warning naming
//        the errno, and the sender resends (CH-2, CH-3): never a silent drop, never a hang.
//   CH-26 A lent part's memory is the sender's envelope's, held until the receiver
//        acknowledged that envelope (it acks at once after a pull) or the connection is
//        closed: on expiry (CH-3), stop() and forget() the sender closes the connection
//        before it hands the envelope back, and the receiver delivers a pulled envelope only
//        if its connection is still open after the copy, so it never delivers bytes the
//        sender had released. Nothing grows: NetStats::lent_parts counts the parts lent on
//        open connections and not yet acknowledged.
//   Shared blocks (CH-29, shared_parts.h): a part of at least Config::shared_part_min_bytes
//        of an envelope for one receiver is copied by the sending thread into a shared block
//        (a sealed memfd the sender keeps for the next part of its size) and lent with the
//        block's name (WI-9); a receiver that pulls maps the block and claims it instead, and
//        has it alone until it releases the part. One it cannot map or claim is pulled.
//
// Gateways (docs/channel.md, "Gateways"): a client that procs cannot reach (behind NAT,
// outside a cluster) attaches through a gateway Net it can reach, as Monarch's attach() does:
//   GW-1 A client Net with Config::via keeps one duplex connection to the gateway: it dials,
//        proves the secret (and TLS) as any dialler, sends Hello{flags = kHelloReverse}, and
//        from then on that socket carries the gateway's link to the client (the gateway
//        sends Hello and Data, the client HelloAck and Acks). The gateway names the client
//        by a routed address, its own address with a fresh incarnation; the client's
//        identity is that address, and it listens on no socket at all.
//   GW-2 A gateway delivers to the client, over its duplex, every envelope sent to the
//        routed address: procs dial the gateway's port (an incarnation does not route) and
//        name the routed address in their Hello (Hello::to). When the duplex breaks, the
//        client re-dials and the gateway's link resumes on the new socket with its session:
//        nothing is lost or delivered twice (CH-1..CH-3 hold end to end on each hop).
//   GW-3 The client reaches every other TCP address through the gateway, over its one link
//        to the gateway's address: each envelope carries, last, a header naming where it
//        goes (kViaToHeader), which the gateway takes off before it sends the envelope on
//        from its own Net (one session per hop: order holds per destination end to end). So
//        the client holds two connections, both to the gateway's port: the duplex and that
//        link. What comes back undelivered comes back without the header.
//   GW-4 A gateway serves only connections that passed its setup (secret, TLS: CH-8, CH-9)
//        and a Unix peer of its own user (CH-16); it forwards to TCP addresses only (a Unix
//        socket trusts any process of its user); a duplex may claim only an address of this
//        gateway (its host and port), and a Net that is no gateway refuses a duplex.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "podium/base/clock.h"
#include "podium/base/error.h"
#include "podium/channel/address.h"
#include "podium/channel/tls_config.h"
#include "podium/wire/envelope.h"

namespace asio {
class io_context;
}

namespace podium::channel {

enum class ChannelErrc : uint16_t {
  kBadAddress = 100,
  kListenFailed = 101,
  kConnectFailed = 102,
  kDeliveryTimeout = 103,
  kCancelled = 104,
  kFrameTooLarge = 105,
  kMalformedFrame = 106,
  kProtocol = 107,
  kAuthFailed = 108,  // a TCP peer did not prove, or did not accept, the shared secret
  kTlsFailed = 109,   // bad TLS settings, a refused TLS handshake, or a peer that has TLS
                      // when this process has not (or the other way round)
};
constexpr Subsystem subsystem_of(ChannelErrc) { return Subsystem::kChannel; }

struct Config {
  size_t max_frame_bytes = size_t{1} << 31;
  uint32_t max_parts = 1024;  // parts per envelope (at most 65535)
  // A Data frame's msgpack header (dest, sender, string headers): small, far below the frame
  // limit (WI-5). send() refuses an envelope whose header could exceed it.
  uint32_t max_header_bytes = 1u << 20;
  // CH-13: an inbound connection that has not finished its handshake (TLS, secret, Hello)
  // this long after it was accepted is closed.
  std::chrono::milliseconds handshake_timeout{10'000};
  // CH-14: connections per listener that may be mid-handshake at once.
  uint32_t max_unauthenticated = 64;
  std::chrono::milliseconds delivery_timeout{30'000};
  std::chrono::milliseconds reconnect_min{2};
  std::chrono::milliseconds reconnect_max{500};
  uint32_t ack_every = 256;                 // receiver acks after this many envelopes ...
  // ... or this long after the first unacked one, unless it sends to the peer first (CH-10).
  // Long, because request/reply traffic acks with its next send to the peer: the timer only
  // acks the last messages of an exchange, and each time it fires it wakes both ends (1 ms
  // here cost every proc of a cast two wake-ups per call: docs/cast.md). The price: stop()
  // hands back envelopes of up to this long ago that were delivered but not yet acked (CH-3).
  std::chrono::microseconds ack_delay{50'000};
  // CH-10 acks with a send only what has waited this long: a fast exchange (a ping-pong, a
  // pipelined stream with replies) keeps one Ack per ack_every envelopes instead of one per
  // send; a slower one (a proc called every few ms) acks each call with its next reply.
  std::chrono::microseconds ack_with_send_after{1000};
  std::chrono::microseconds flush_later_delay{50};  // CH-7's bound
  // The job's shared secret. When set, every TCP connection, in and out, passes a
  // challenge-response on it before any frame is read (CH-8). Unix and in-process links
  // stay within this user's reach (0700 socket directory) and do not authenticate.
  std::string secret;
  // Mutual TLS 1.3 for every TCP connection, in and out (CH-9); off by default. With a
  // secret as well, the challenge-response runs inside the TLS stream.
  TlsConfig tls;
  // TCP listeners set SO_REUSEPORT, so they can bind a port that a PortReservation (below)
  // holds. Only for a proc whose host agent reserved its port; two listeners of one user on
  // one port would otherwise share connections.
  bool reuse_port = false;
  // The time every timer of this Net reads (delivery and handshake deadlines, acks, backoff,
  // CH-7's bound): null is the real clock; a test passes a base::ManualClock and moves time
  // with advance() (docs/channel.md).
  std::shared_ptr<base::Clock> clock;
  // GW-1: the gateway this client reaches every other TCP address through (GW-3), and its
  // duplex (started by Net::start_via(); a Net that listens does not need one). Unset: a
  // plain Net.
  std::optional<Address> via;
  // CH-25: on a Unix-socket link, parts of at least this many bytes are lent to a receiver
  // that can pull them (at least wire::kMinLendBytes; 0: never). The default is
  // PODIUM_CMA_PART_MIN from the environment, else 512 KiB.
  size_t lend_min_bytes = default_lend_min_bytes();
  // CH-25: whether this Net pulls the parts its Unix-socket peers lend (false: they send
  // every part inline).
  bool pull_lent = true;
  // CH-29: on a Unix-socket link, a part of at least this many bytes (and at least
  // lend_min_bytes) of an envelope for one receiver (not Envelope::fan_out) is copied into a
  // shared block that the receiver maps, instead of being pulled (0: never). The default is
  // PODIUM_SHARED_PART_MIN from the environment, else 1 MiB.
  size_t shared_part_min_bytes = default_shared_part_min_bytes();

  static size_t default_lend_min_bytes();
  static size_t default_shared_part_min_bytes();
};

// A TCP port held for a proc that will listen on it: a socket bound with SO_REUSEPORT and
// never listening, so the kernel gives the port to nobody else (neither bind(0) nor an
// outgoing connection's ephemeral port) until the reservation is dropped, while the proc,
// listening with Config::reuse_port, binds it too. Lets a host agent name a proc's address
// before the proc runs. Move-only; closes its socket when destroyed.
class PortReservation {
 public:
  // Reserves a free port on `host` (an address of this machine, or a name that resolves to
  // one).
  [[nodiscard]] static Result<PortReservation> make(const std::string& host);
  PortReservation(PortReservation&& other) noexcept;
  PortReservation& operator=(PortReservation&& other) noexcept;
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;
  ~PortReservation();
  uint16_t port() const { return port_; }

 private:
  PortReservation(int fd, uint16_t port) : fd_(fd), port_(port) {}
  int fd_ = -1;
  uint16_t port_ = 0;
};

// Sends made on this thread while a FlushLater lives may wait for the link's next write
// (CH-7). For a sender that knows more sends follow at once, e.g. an actor answering the
// first of several calls already queued: the burst of replies then costs one writev instead
// of one per reply. The io_context must be run by someone (the bound is a timer there).
class FlushLater {
 public:
  FlushLater();
  ~FlushLater();
  FlushLater(const FlushLater&) = delete;
  FlushLater& operator=(const FlushLater&) = delete;
  static bool active();

 private:
  bool outer_;
};

// What a Net refused of its peers since it was made (CH-13..CH-15). Each counter only grows.
struct NetStats {
  uint64_t refused_oversize = 0;   // a claimed length over a limit (WI-3, WI-5)
  uint64_t refused_malformed = 0;  // bad bytes, a truncated frame, a protocol error
  uint64_t refused_auth = 0;       // a wrong or missing secret, a refused TLS peer
  uint64_t handshake_timeouts = 0;        // CH-13
  uint64_t unauthenticated_cap_hits = 0;  // CH-14
  // Connections, in or out, closed because this process could not run its side of the CH-8
  // exchange (no random bytes, no HMAC from OpenSSL): not the peer's doing (CH-18).
  uint64_t setup_errors = 0;
  // CH-26: parts lent on open connections and not yet acknowledged, now (not a counter).
  uint64_t lent_parts = 0;
  // CH-25, in this whole process: pulls of lent parts started, and those that failed.
  uint64_t pulls = 0;
  uint64_t pull_failures = 0;
  // CH-29, in this whole process: parts copied into shared blocks and blocks made for them
  // (sender); parts taken as a mapped block, and parts naming one that were pulled instead
  // (receiver).
  uint64_t shared_copied = 0;
  uint64_t shared_blocks_made = 0;
  uint64_t shared_mapped = 0;
  uint64_t shared_map_failed = 0;
};

using DeliverFn = std::function<void(wire::Envelope&&)>;
using UndeliverableFn = std::function<void(wire::Envelope&&, Error)>;

class Net {
 public:
  // Does no I/O.
  Net(asio::io_context& io, Config config, DeliverFn deliver, UndeliverableFn undeliverable);
  ~Net();
  Net(const Net&) = delete;
  Net& operator=(const Net&) = delete;

  // Starts accepting on `addr`. Returns the bound address (a TCP port 0 becomes the chosen
  // port). A stale Unix socket file at the path is replaced. Thread-safe.
  // `fd` >= 0: accept on that inherited listening TCP socket instead (addr names its host;
  // the bound port is the socket's).
  [[nodiscard]] Result<Address> listen(const Address& addr, int fd = -1);

  // Queues `env` for the proc listening at `to` (CH-1..CH-3, CH-6). Thread-safe.
  void send(const Address& to, wire::Envelope env);

  // Closes listeners and connections; envelopes not yet acknowledged are handed to the
  // UndeliverableFn with ChannelErrc::kCancelled. Idempotent. Thread-safe.
  void stop();

  // CH-11: drops the link to `peer`, a process known to have ended (its exit was seen), so
  // that a long-lived process that talks to many short-lived ones does not keep a link (its
  // queue, timers and buffers) per peer it ever had. What the link still holds is handed
  // back with kCancelled and `why` ("the proc at unix:... has exited"); a later send() to
  // `peer` dials afresh. Does nothing for a peer this Net never sent to. Thread-safe.
  void forget(const Address& peer, const std::string& why);

  // GW-1: starts the duplex to Config::via (a Net that listens nowhere). `event` runs on an
  // io thread with the routed address each time the gateway (re)opens the duplex, or with
  // why an attempt failed (the Net keeps re-dialling, with backoff, until stop()). It may run
  // under the Net's locks: it must not call into the Net, only record what it is told.
  void start_via(std::function<void(Result<Address>)> event);

  // GW-2..GW-4: serves clients that attach through this Net; `self` is the address procs
  // reach it by (a routed address is `self` with an incarnation). Call once it listens.
  void serve_as_gateway(const Address& self);

  // How many peers this Net holds a link to (tests).
  size_t link_count() const;

  // How many envelopes sent to `to` its peer has not acknowledged yet (0 without a link to
  // it): a test polls it to know that the acks have arrived, instead of sleeping. Thread-safe.
  size_t unacknowledged(const Address& to) const;

  // What this Net refused of its peers so far (CH-13..CH-15). Thread-safe.
  NetStats stats() const;

  const Config& config() const;

  // `fn` runs on the io thread after each batch of deliveries (the envelopes of one read),
  // once the channel holds no lock: the place to run work that the DeliverFn calls deferred.
  // Call before the first listen() or send(); not thread-safe.
  void on_batch_end(std::function<void()> fn);

  // Test hook: abruptly closes every socket of this Net (both directions), as a network
  // reset would; links re-dial and resend.
  void reset_connections_for_test();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace podium::channel
