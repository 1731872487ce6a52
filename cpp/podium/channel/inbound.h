// Internal to podium_channel: the receiving side of socket links.
//
// A SocketListener accepts connections; each becomes an Inbound that reads Hello, then Data,
// delivers each envelope whose seq is above what its Session has delivered (CH-1, CH-2), and
// answers on the same socket with HelloAck and batched cumulative Acks. A malformed frame
// closes only that connection, with a warning naming the peer and the reason (CH-5), counted
// and rate-limited (CH-15). A connection is closed when its handshake (TLS, secret, Hello) has
// not completed within Config::handshake_timeout (CH-13); a listener closes at once a
// connection accepted while Config::max_unauthenticated others are mid-handshake (CH-14).
//
// Threads: only the read chain (one outstanding read per connection) decodes and delivers;
// Inbound::mu_ guards the socket and the ack state it shares with the ack timer, close()
// and stop(). Session::mu serialises delivery when a stale and a new connection of one
// session overlap (CH-4).
#pragma once

#include <asio/basic_socket_acceptor.hpp>
#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "podium/channel/auth.h"
#include "podium/channel/core.h"
#include "podium/channel/socket_util.h"
#include "podium/channel/tls.h"
#include "podium/channel/tls_setup.h"
#include "podium/wire/frame.h"
#include "podium/wire/message.h"

namespace podium::channel::internal {

// What a receiver remembers of one sending link incarnation (Hello::session_id). Kept while
// a connection uses it and for 2 x delivery_timeout after, longer than any sender with the
// same config keeps an envelope for resending.
struct Session {
  explicit Session(uint64_t id) : id(id) {}
  const uint64_t id;
  std::mutex mu;                       // held while delivering
  std::atomic<uint64_t> delivered{0};  // highest seq delivered; written under mu
  int connections = 0;                 // guarded by Core::mu
  Clock::time_point idle_since;        // guarded by Core::mu
};

class Inbound : public std::enable_shared_from_this<Inbound> {
 public:
  Inbound(std::shared_ptr<Core> core, Socket socket, Transport transport, std::string local);
  // `unauthenticated` counts its listener's connections mid-handshake (CH-14): this one is
  // counted in it until its Hello is accepted or it closes.
  Inbound(std::shared_ptr<Core> core, Socket socket, Transport transport, std::string local,
          std::shared_ptr<std::atomic<uint32_t>> unauthenticated);
  // GW-1: a client's duplex, lent by its link once the setup passed: it receives the
  // gateway's link; `on_close` runs (posted) with the reason when the connection ends.
  Inbound(std::shared_ptr<Core> core, Socket socket, Transport transport, std::string local,
          std::unique_ptr<TlsSession> tls, std::function<void(const std::string&)> on_close);
  ~Inbound();
  void start();
  // Closes the connection. A refusal is counted (CH-15) and logged as a rate-limited
  // warning (CH-5); kNone logs `why` at debug. Thread-safe.
  void close(const std::string& why, Core::Refusal refusal);
  // CH-14: closes this connection if it is still mid-handshake and its peer has proved
  // nothing yet (no secret, no TLS, no Hello): the listener makes room for a newer one.
  // Returns whether it closed it. Takes this connection's mutex.
  bool evict_if_unproven(const std::string& why);
  // Whether it is still mid-handshake with nothing proved (as above), without closing it.
  bool unproven();
  // Acknowledges now what this connection has delivered, and disarms the delayed ack: the
  // Net is sending to this peer anyway (CH-10). Thread-safe.
  void flush_ack();

 private:
  void close_locked(const std::string& why, Core::Refusal refusal);
  void on_handshake_timeout();  // CH-13
  void release_unauthenticated_locked();
  enum class ReadFor : uint8_t { kSetup, kFrames };
  void arm_read_locked(ReadFor what);  // the one socket read of this connection
  void on_read(const std::error_code& ec, size_t n);
  // Decodes and delivers the frames in decoder_ (the caller entered the gate): kDone when
  // all were, kClosed when the connection closed, kPulling when a frame's lent parts are
  // being pulled (CH-25): the read chain resumes from on_pulled().
  enum class Frames : uint8_t { kDone, kClosed, kPulling };
  Frames deliver_frames(BatchEnd& batch, std::unique_lock<std::mutex>& delivering);
  // Delivers one new envelope of the session (forwarding it for a gateway).
  void deliver_data(wire::Data& d, BatchEnd& batch);
  // After the frames of a read: the ack (now or by the timer), then the next read.
  void after_frames();
  // CH-25 (inbound_lend.cc): whether this connection pulls the parts its peer lends (the
  // Hello's probe read at the pid the kernel names; sets pull_pid_).
  bool probe_lender(const wire::Hello& hello);
  // CH-15: whether a frame's lent parts fit max_frame_bytes; else closes the connection.
  bool lent_fit(const wire::Data& d);
  // Hands the lent parts of `d` to the pullers; the read chain resumes in on_pulled().
  Frames start_pull(wire::Data&& d);
  // CH-25, CH-26: the lent parts of pulling_ arrived (or failed with errno `err`).
  void on_pulled(int err, std::vector<Buffer> parts);
  // CH-8, CH-9: the setup (tls_setup.h) runs before the first frame; these feed it.
  void start_setup_locked();
  void on_setup_input(const std::error_code& ec, size_t n);
  void after_setup_locked(TlsSetup::Status status);
  bool accept_hello(const wire::Hello& hello);
  // GW-2..GW-4 (gateway.cc): a gateway's answer to a Hello that names an address: whether to
  // forward this connection's envelopes there (`out`); false when it closed the connection.
  bool route_of(const wire::Hello& hello, std::optional<Address>& out);
  // GW-1: a client's duplex arrived: hands the socket to the link to its routed address.
  // Always false: the read chain of this connection ends.
  bool accept_duplex(const wire::Hello& hello);
  // GW-1, in the client: the gateway's Hello on the duplex names the routed address.
  bool duplex_opened(const wire::Hello& hello);
  void ack_locked();    // queues an Ack when the session delivered past acked_
  void write_locked();  // writes out_ from out_off_
  void on_writable(const std::error_code& ec);
  void on_ack_timer(const std::error_code& ec);

  const std::shared_ptr<Core> core_;
  const std::string local_;  // the listen address it came in on
  const std::string peer_;
  wire::FrameDecoder decoder_;  // read chain only

  std::mutex mu_;
  // Guarded by mu_ (session_ is written by the read chain under mu_, which reads it freely):
  Socket socket_;
  bool closed_ = false;
  std::shared_ptr<Session> session_;
  std::string hello_from_;  // the sender's listen address, for logs
  std::optional<Address> listed_as_;  // its key in Core::inbound_by_peer, once listed
  uint64_t acked_ = 0;      // highest seq acknowledged on this connection
  std::vector<std::byte> out_;  // control frame being written, out_off_ bytes sent
  size_t out_off_ = 0;
  bool write_waiting_ = false;  // an async_wait(write) is pending
  base::Timer ack_timer_;
  bool ack_armed_ = false;
  Clock::time_point unacked_since_{};  // first delivery after the last Ack; {} when none
  const Transport transport_;
  // CH-13: armed by start(), cancelled once Hello is accepted; bounds the CH-9 setup, the
  // CH-8 exchange and the Hello together.
  base::Timer auth_timer_;
  bool authenticated_ = false;  // the CH-8 or CH-9 setup passed (for the timeout's reason)
  // CH-14: the listener's count of connections mid-handshake; null once released.
  std::shared_ptr<std::atomic<uint32_t>> unauthenticated_;
  // CH-9. tls_ is set by start() under mu_ before the first read and never changes after;
  // the session has its own mutex, so the read chain decrypts without mu_.
  std::unique_ptr<TlsSession> tls_;
  // CH-8, CH-9: the connection's setup while it runs (read chain, under mu_); drives tls_.
  std::optional<TlsSetup> setup_;
  // Read chain: where the pending read lands, and whether anything was read yet (to tell a
  // TLS peer from a plaintext one by its first bytes).
  const std::byte* read_into_ = nullptr;
  bool first_read_ = true;
  // GW-1: a client's duplex (set at construction), and what runs when it closes.
  bool lent_ = false;  // set by the constructor, then only read
  std::function<void(const std::string&)> on_close_;  // guarded by mu_
  // GW-2, GW-3: where this connection's envelopes go instead of DeliverFn, and whether this
  // Net is a gateway (read chain only, set at the Hello).
  std::optional<Address> forward_to_;
  bool gateway_ = false;
  // GW-3: sends on an envelope a client wrapped (kViaToHeader) to the address it names.
  void forward_wrapped(wire::Envelope&& env);
  // CH-25 (read chain): the peer's pid when it proved at its Hello that we can read its
  // memory (0: it sends every part inline), and the envelope whose lent parts are being
  // pulled while the read chain waits.
  pid_t pull_pid_ = 0;
  std::optional<wire::Data> pulling_;
};

class SocketListener final : public ListenerBase,
                             public std::enable_shared_from_this<SocketListener> {
 public:
  // `fd` >= 0: adopt that listening socket (inherited; addr names its host) instead of
  // binding addr.
  [[nodiscard]] static Result<std::shared_ptr<SocketListener>> listen(std::shared_ptr<Core> core,
                                                                      const Address& addr,
                                                                      int fd = -1);
  const Address& bound() const { return bound_; }
  // Stops accepting and removes the socket file it bound (if still the same file).
  void close() override;

 private:
  using Acceptor = asio::basic_socket_acceptor<asio::generic::stream_protocol>;
  SocketListener(std::shared_ptr<Core> core, Address addr);
  void accept_locked();
  void on_accept(const std::error_code& ec, Socket socket);

  const std::shared_ptr<Core> core_;
  Address bound_;
  std::string bound_text_;
  std::mutex mu_;
  // Guarded by mu_:
  Acceptor acceptor_;
  base::Timer retry_;  // re-accept after an error such as EMFILE
  bool closed_ = false;
  // CH-14: connections accepted here that have not completed their handshake (each Inbound
  // holds it and gives its unit back once).
  const std::shared_ptr<std::atomic<uint32_t>> unauthenticated_ =
      std::make_shared<std::atomic<uint32_t>>(0);
  // CH-14: the connections accepted here, oldest first, that may still be mid-handshake; at
  // the cap the oldest that proved nothing is closed for the new one. Entries of connections
  // that finished or went are dropped as they are met (and in bulk when it grows past twice
  // the cap). Guarded by mu_.
  std::deque<std::weak_ptr<Inbound>> pending_;
  // The socket file this listener bound, to unlink on close only if nobody replaced it.
  std::string path_;
  uint64_t dev_ = 0, ino_ = 0;
};

}  // namespace podium::channel::internal
