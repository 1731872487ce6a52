// Internal to podium_channel: the sending end of one session, from a Net to one destination
// Address (docs/channel.md).
//
// Link keeps the envelopes not yet acknowledged, in seq order, with their deadlines; it
// re-dials with backoff and hands back what expires. A transport subclass moves the queue to
// the peer: SocketLink over a Unix or TCP socket, InprocLink (inproc.h) into the destination
// Net's memory.
//
// Threads: send(), stop() and reset_for_test() are thread-safe; everything else runs on
// io_context threads. One mutex (mu_) guards all mutable state, including the socket: a
// send() on a connected idle link writes on the caller's thread under it (CH-6).
#pragma once

#include <sys/uio.h>

#include <asio/ip/tcp.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "podium/channel/auth.h"
#include "podium/channel/core.h"
#include "podium/channel/socket_util.h"
#include "podium/channel/tls.h"
#include "podium/channel/tls_setup.h"
#include "podium/wire/frame.h"

namespace podium::channel::internal {

class Link : public std::enable_shared_from_this<Link> {
 public:
  Link(std::shared_ptr<Core> core, Address to);
  virtual ~Link() = default;
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  void send(wire::Envelope&& env);
  // Connects now, with nothing queued (a client's duplex, GW-1). Thread-safe.
  void start();
  // Closes the connection and hands back everything not acknowledged (kCancelled), on the
  // calling thread; a send() after it is handed back at once. `why` completes the reason
  // ("net stopped", "... has exited"). Idempotent.
  void stop(std::string why = "net stopped");
  virtual void reset_for_test() {}
  // Envelopes sent or queued that the peer has not acknowledged yet. Thread-safe.
  size_t unacknowledged();
  // CH-26: parts lent to the peer on the open connection and not acknowledged. Thread-safe.
  size_t lent_parts() {
    std::lock_guard lock(mu_);
    return lent_parts_locked();
  }
  asio::io_context& io() const { return core_->io; }

 protected:
  enum class State : uint8_t { kIdle, kConnecting, kConnected, kBackoff, kStopped };

  // Transport hooks, all called with mu_ held.
  virtual void connect_locked() = 0;  // start one attempt; ends in connected or failed_locked()
  virtual void push_locked() = 0;     // entries were appended to queue_ while connected
  virtual void close_locked() = 0;    // drop the connection, no callbacks
  // Moves out envelopes the transport holds beyond queue_ (stop()).
  virtual void take_in_flight_locked(std::vector<Outgoing>&) {}
  // How many envelopes the transport holds beyond queue_ (unacknowledged()).
  virtual size_t in_flight_locked() { return 0; }
  // CH-26: whether queue_[i] went out with lent parts on the open connection, and how many
  // parts are lent so.
  virtual bool lent_locked(size_t) { return false; }
  virtual size_t lent_parts_locked() { return 0; }

  // The connection failed or broke: retry after the backoff if anything is queued.
  void failed_locked(std::string why);
  // Drops entries the peer acknowledged (seq <= `seq`), keeping the write cursor valid.
  void acked_locked(uint64_t seq);
  void reset_backoff_locked() { backoff_ = core_->config.reconnect_min; }

  const std::shared_ptr<Core> core_;
  const Address to_;
  const std::string to_text_;

  std::mutex mu_;
  // Guarded by mu_:
  State state_ = State::kIdle;
  Fifo<Outgoing> queue_;  // unacknowledged, seq order
  // Write cursor of byte transports: queue_[0, written_) are on the wire, and offset_ bytes
  // of queue_[written_]. Both reset to 0 when a connection starts (everything is resent).
  size_t written_ = 0;
  size_t offset_ = 0;
  std::string last_error_;  // why the last connection attempt or connection failed
  std::string stop_why_;    // stop()'s reason, for sends that come after it
  // Set at construction: a link that re-dials after a failure even with nothing queued (a
  // client's duplex, GW-1), and reports each failure to Core::via_event.
  bool persistent_ = false;

 private:
  void arm_deadline_locked(Clock::time_point at);
  void on_deadline(const std::error_code& ec);
  void on_retry(const std::error_code& ec);

  // Guarded by mu_:
  uint64_t next_seq_ = 0;
  Clock::duration backoff_;
  base::Timer retry_timer_;
  // One timer for all deadlines, armed no later than queue_.front().deadline while anything
  // is queued. It is not cancelled when the queue empties, so that a busy link's send()
  // never touches it: when it fires on an empty queue after recent sends it re-arms for
  // delivery_timeout; only an idle link lets it lapse.
  base::Timer deadline_timer_;
  bool deadline_armed_ = false;
  bool sent_since_deadline_ = false;

 protected:
  // CH-7 (FlushLater), guarded by mu_: envelopes queued without a write, and the timer that
  // writes them at the latest flush_later_delay after the first.
  size_t flush_later_count_ = 0;
  bool flush_later_armed_ = false;
  base::Timer flush_later_timer_;
  // True when this send may wait (and arms the timer); requires mu_ and a connected link.
  bool defer_flush_locked();
};

// A link over a Unix or TCP stream socket: Hello, then Data frames; HelloAck/Acks come back.
class SocketLink final : public Link {
 public:
  // kDial: dials `to`. kAdopted (GW-2): a gateway's link to a client attached through it: it
  // never dials, it sends on the duplex the client opened (adopt()). kDuplex (GW-1): a
  // client's duplex: dials its gateway `dial`, proves itself, sends a reverse Hello and lends
  // the socket to an Inbound that receives the gateway's link; re-dials whenever that
  // connection ends.
  enum class Mode : uint8_t { kDial, kAdopted, kDuplex };
  SocketLink(std::shared_ptr<Core> core, Address to, Mode mode = Mode::kDial,
             std::optional<Address> dial = std::nullopt);
  void reset_for_test() override;
  Mode mode() const { return mode_; }
  // GW-2 (kAdopted): a client's duplex arrived (already past its setup): the session goes on
  // over it, in place of any earlier one. Thread-safe.
  void adopt(Socket socket, std::unique_ptr<TlsSession> tls);

 private:
  void connect_locked() override;
  void push_locked() override;
  void close_locked() override;

  void connect_next_locked();
  void on_resolved(uint64_t gen, const std::error_code& ec,
                   const asio::ip::tcp::resolver::results_type& results);
  void on_connected(uint64_t gen, const std::error_code& ec);
  void start_read_locked();
  void on_read(uint64_t gen, const std::error_code& ec, size_t n);
  void on_writable(uint64_t gen, const std::error_code& ec);
  // After connect: the Hello, then frames (a new session) or HelloAck first (resumed).
  void start_session_locked();
  // CH-8, CH-9: the setup (tls_setup.h) runs before the Hello; these feed it (link_tls.cc).
  void start_setup_locked();
  void on_setup_input(uint64_t gen, const std::error_code& ec, size_t n);
  void after_setup_locked(TlsSetup::Status status);
  bool send_tls_locked();  // sends TLS output; false when the link failed
  // The peer refused us (or we it): everything queued goes back now with `code`.
  void refused_locked(ChannelErrc code, const std::string& why);
  void auth_failed_locked(const std::string& why);  // kAuthFailed, "authentication failed: "
  // Decodes the HelloAck/Acks in decoder_; false when the link failed.
  bool take_acks_locked();
  // Writes queued bytes until done or the socket is full (then waits for writability).
  void flush_locked();
  // One gathered write of plaintext: through TLS when it is on. Bytes taken, or -errno.
  ssize_t write_iov_locked(const iovec* iov, size_t count);

  // GW-1 (kDuplex): sends the reverse Hello and hands the socket to an Inbound.
  void lend_locked();
  void lent_closed(uint64_t gen, const std::string& why);

  const uint64_t session_id_;
  const Mode mode_;
  const Address dial_;  // where connections go: to_, or the gateway (kDuplex)
  // Guarded by mu_ (see Link):
  Socket socket_;
  uint64_t gen_ = 0;  // bumped per attempt; handlers of older attempts do nothing
  asio::ip::tcp::resolver resolver_;
  std::vector<Endpoint> endpoints_;  // left to try in this attempt
  std::vector<std::byte> hello_;     // this connection's Hello, hello_off_ bytes sent
  size_t hello_off_ = 0;
  bool resumed_ = false;  // the session had a connection before this one
  bool holding_ = false;  // a resumed session writes no Data until HelloAck says where to go on
  bool write_waiting_ = false;  // an async_wait(write) is pending
  bool authenticating_ = false;  // CH-8, CH-9 in progress: nothing may be written but its bytes
  base::Timer auth_timer_;  // bounds the setup
  std::unique_ptr<TlsSession> tls_;  // this connection's TLS (CH-9); null in plaintext
  std::optional<TlsSetup> setup_;    // the connection's setup while it runs; drives tls_
  wire::FrameDecoder decoder_;  // HelloAck/Ack from the peer
  const std::byte* read_into_ = nullptr;  // where the pending read lands
  bool first_read_ = false;               // no byte read yet on this connection
  // CH-25: the peer pulls lent parts on this connection (its HelloAck said so), for frames
  // from seq lend_from_ on (one half written inline before the HelloAck stays inline).
  bool lend_ok_ = false;
  uint64_t lend_from_ = 0;
  // The lend threshold of frame queue_[i] on this connection (0: all inline).
  size_t lend_min_locked(const Outgoing& o) const {
    return lend_ok_ && o.seq >= lend_from_ ? core_->config.lend_min_bytes : 0;
  }
  bool lent_locked(size_t i) override;
  size_t lent_parts_locked() override;
  // Reused by flush_locked() so that the hot path does not allocate.
  std::vector<std::byte> heads_;
  std::vector<size_t> head_ends_, frame_bytes_;
  std::vector<iovec> iov_;
};

}  // namespace podium::channel::internal
