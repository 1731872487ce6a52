#include "podium/channel/link.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <random>

#include <asio/post.hpp>

#include "podium/wire/message.h"

namespace podium::channel::internal {
namespace {

// Past these, flush_locked() writes what it has gathered and loops.
constexpr size_t kBatchBytes = size_t{1} << 20;
constexpr size_t kMaxIov = IOV_MAX;

// FlushLater: at most this many envelopes wait for a later write (CH-7).
constexpr size_t kFlushLaterFrames = 64;
thread_local bool tls_flush_later = false;

uint64_t random_session_id() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = uint64_t(rd()) << 32 | rd();
  return id;
}

}  // namespace

// ---- Link ----

Link::Link(std::shared_ptr<Core> core, Address to)
    : core_(std::move(core)),
      to_(std::move(to)),
      to_text_(to_.to_string()),
      backoff_(core_->config.reconnect_min),
      retry_timer_(core_->io, core_->config.clock),
      deadline_timer_(core_->io, core_->config.clock),
      flush_later_timer_(core_->io, core_->config.clock) {}

bool Link::defer_flush_locked() {
  if (!tls_flush_later || flush_later_count_ + 1 >= kFlushLaterFrames) return false;
  ++flush_later_count_;
  if (!flush_later_armed_) {
    flush_later_armed_ = true;
    flush_later_timer_.expires_after(core_->config.flush_later_delay);
    flush_later_timer_.async_wait([self = shared_from_this()](const std::error_code& ec) {
      if (ec) return;
      std::lock_guard lock(self->mu_);
      self->flush_later_armed_ = false;
      if (self->flush_later_count_ > 0 && self->state_ == State::kConnected) {
        self->flush_later_count_ = 0;
        self->push_locked();
      }
    });
  }
  return true;
}

void Link::send(wire::Envelope&& env) {
  std::unique_lock lock(mu_);
  if (state_ == State::kStopped) {
    std::string why = stop_why_;
    lock.unlock();
    std::vector<Outgoing> back;
    back.push_back({0, {}, std::move(env)});
    hand_back(*core_, back, ChannelErrc::kCancelled, why);
    return;
  }
  auto deadline = core_->now() + core_->config.delivery_timeout;
  queue_.push_back({++next_seq_, deadline, std::move(env)});
  sent_since_deadline_ = true;
  if (!deadline_armed_) arm_deadline_locked(deadline);
  if (state_ == State::kIdle) {
    connect_locked();
  } else if (state_ == State::kConnected && !defer_flush_locked()) {
    flush_later_count_ = 0;  // this write takes the deferred ones along (CH-7)
    push_locked();
  }  // connecting or backing off: the queue goes out once connected
}

void Link::start() {
  std::lock_guard lock(mu_);
  if (state_ == State::kIdle) connect_locked();
}

void Link::stop(std::string why) {
  std::vector<Outgoing> back;
  {
    std::lock_guard lock(mu_);
    if (state_ == State::kStopped) return;
    state_ = State::kStopped;
    stop_why_ = why;
    close_locked();
    retry_timer_.cancel();
    deadline_timer_.cancel();
    take_in_flight_locked(back);  // older than anything still in queue_
    queue_.drain_into(back);
    written_ = offset_ = 0;
  }
  hand_back(*core_, back, ChannelErrc::kCancelled, why + " before " + to_text_ + " acknowledged");
}

size_t Link::unacknowledged() {
  std::lock_guard lock(mu_);
  return queue_.size() + in_flight_locked();
}

void Link::failed_locked(std::string why) {
  close_locked();
  written_ = offset_ = 0;
  last_error_ = std::move(why);
  if (persistent_ && core_->via_event) {
    core_->via_event(std::unexpected(make_error(ChannelErrc::kConnectFailed, last_error_)));
  }
  if (queue_.empty() && !persistent_) {
    state_ = State::kIdle;  // the next send() dials again
    return;
  }
  state_ = State::kBackoff;
  spdlog::debug("channel: link to {}: {}; retrying in {} us", to_text_, last_error_,
                std::chrono::duration_cast<std::chrono::microseconds>(backoff_).count());
  retry_timer_.expires_after(backoff_);
  retry_timer_.async_wait([self = shared_from_this()](const std::error_code& ec) {
    self->on_retry(ec);
  });
  backoff_ = std::min<Clock::duration>(backoff_ * 2, core_->config.reconnect_max);
}

void Link::on_retry(const std::error_code& ec) {
  if (ec) return;  // cancelled by stop()
  std::lock_guard lock(mu_);
  if (state_ != State::kBackoff) return;
  if (queue_.empty() && !persistent_) {
    state_ = State::kIdle;
  } else {
    connect_locked();
  }
}

void Link::acked_locked(uint64_t seq) {
  while (!queue_.empty() && queue_.front().seq <= seq) {
    if (written_ > 0) {
      --written_;
    } else if (offset_ > 0) {
      break;  // its frame is half on the wire; it leaves once written
    }
    queue_.pop_front();
  }
}

void Link::arm_deadline_locked(Clock::time_point at) {
  deadline_armed_ = true;
  deadline_timer_.expires_at(at);
  deadline_timer_.async_wait([self = shared_from_this()](const std::error_code& ec) {
    self->on_deadline(ec);
  });
}

void Link::on_deadline(const std::error_code& ec) {
  if (ec) return;  // cancelled by stop()
  // Enter the gate before taking anything out of the queue: once stop() has closed it, the
  // queue is stop()'s to hand back.
  Gate::Scope gate(core_->gate);
  if (!gate) return;
  std::vector<Outgoing> expired;
  std::string reason;
  auto timeout_ms = core_->config.delivery_timeout.count();
  {
    std::lock_guard lock(mu_);
    if (state_ == State::kStopped) return;
    auto now = core_->now();
    while (!queue_.empty() && queue_.front().deadline <= now) {
      if (written_ == 0 && offset_ > 0) {
        // Half a frame is on the wire and the peer has not read it for the whole timeout:
        // only a new connection can drop it.
        failed_locked("write stalled for " + std::to_string(timeout_ms) + " ms");
      } else if (lent_locked(0)) {
        // CH-26: the peer may be pulling its lent parts: the connection goes before the
        // memory does, and the peer drops what it pulled.
        failed_locked("lent parts unacknowledged for " + std::to_string(timeout_ms) + " ms");
      }
      if (written_ > 0) --written_;
      expired.push_back(queue_.pop_front());
    }
    if (!expired.empty()) {
      reason = "no ack from " + to_text_ + " within " + std::to_string(timeout_ms) + " ms";
      if (!last_error_.empty()) reason += ": " + last_error_;
    }
  }
  // The timer stays marked armed while the envelopes go back, so that no other expiry of
  // this link runs meanwhile: they are handed back in order, one at a time.
  hand_back(*core_, expired, ChannelErrc::kDeliveryTimeout, reason);
  std::lock_guard lock(mu_);
  deadline_armed_ = false;
  if (state_ == State::kStopped) return;
  if (!queue_.empty()) {
    arm_deadline_locked(queue_.front().deadline);
  } else if (sent_since_deadline_) {
    arm_deadline_locked(core_->now() + core_->config.delivery_timeout);
  }
  sent_since_deadline_ = false;
}

// ---- SocketLink ----

SocketLink::SocketLink(std::shared_ptr<Core> core, Address to, Mode mode,
                       std::optional<Address> dial)
    : Link(std::move(core), std::move(to)),
      session_id_(random_session_id()),
      mode_(mode),
      dial_(dial ? std::move(*dial) : to_),
      socket_(core_->io),
      resolver_(core_->io),
      auth_timer_(core_->io, core_->config.clock),
      decoder_(wire::FrameLimits{.max_frame_bytes = 4096, .max_parts = 0}, 4096) {
  persistent_ = mode == Mode::kDuplex;
}

void SocketLink::reset_for_test() {
  std::lock_guard lock(mu_);
  if (state_ == State::kConnected || state_ == State::kConnecting) {
    failed_locked("connection reset for test");
  }
}

void SocketLink::connect_locked() {
  state_ = State::kConnecting;
  ++gen_;
  endpoints_.clear();
  if (mode_ == Mode::kAdopted) {
    // GW-2: the client dials; the queue waits for its duplex (and expires meanwhile, CH-3).
    if (last_error_.empty()) {
      last_error_ = "the client attached through this gateway has no duplex open";
    }
    return;
  }
  if (dial_.transport == Transport::kUnix) {
    endpoints_.push_back(unix_endpoint(dial_.target));
    connect_next_locked();
    return;
  }
  resolver_.async_resolve(
      dial_.target, std::to_string(dial_.port), asio::ip::tcp::resolver::numeric_service,
      [self = std::static_pointer_cast<SocketLink>(shared_from_this()), gen = gen_](
          const std::error_code& ec, const asio::ip::tcp::resolver::results_type& results) {
        self->on_resolved(gen, ec, results);
      });
}

void SocketLink::on_resolved(uint64_t gen, const std::error_code& ec,
                             const asio::ip::tcp::resolver::results_type& results) {
  std::lock_guard lock(mu_);
  if (gen != gen_ || state_ != State::kConnecting) return;
  if (ec) {
    failed_locked("resolve " + dial_.target + ": " + ec.message());
    return;
  }
  for (const auto& r : results) endpoints_.emplace_back(r.endpoint());
  std::reverse(endpoints_.begin(), endpoints_.end());  // tried from the back
  connect_next_locked();
}

void SocketLink::connect_next_locked() {
  if (endpoints_.empty()) {
    failed_locked("resolve " + dial_.target + ": no addresses");
    return;
  }
  Endpoint ep = endpoints_.back();
  endpoints_.pop_back();
  std::error_code ec;
  socket_.close(ec);
  socket_.open(ep.protocol(), ec);
  if (ec) {
    failed_locked("socket: " + ec.message());
    return;
  }
  socket_.async_connect(ep, [self = std::static_pointer_cast<SocketLink>(shared_from_this()),
                             gen = gen_](const std::error_code& ec) {
    self->on_connected(gen, ec);
  });
}

void SocketLink::on_connected(uint64_t gen, const std::error_code& ec) {
  std::lock_guard lock(mu_);
  if (gen != gen_ || state_ != State::kConnecting) return;
  if (ec) {
    if (endpoints_.empty()) {
      failed_locked("connect: " + ec.message());
    } else {
      connect_next_locked();
    }
    return;
  }
  configure_stream(socket_, dial_.transport);
  state_ = State::kConnected;
  last_error_.clear();
  bool tcp = dial_.transport == Transport::kTcp;
  bool tls = tcp && core_->tls_enabled();
  if (tls || (tcp && !core_->config.secret.empty())) {
    // CH-8, CH-9: no Hello, no frame, until the peer accepted us.
    authenticating_ = true;
    auth_timer_.expires_after(kAuthTimeout);
    auth_timer_.async_wait([self = std::static_pointer_cast<SocketLink>(shared_from_this()),
                            gen](const std::error_code& ec) {
      if (ec) return;
      std::lock_guard lock(self->mu_);
      if (gen != self->gen_ || !self->authenticating_) return;
      self->failed_locked(self->tls_ ? "TLS: the peer did not complete the TLS setup within 10 s "
                                       "(is it a podium listener?)"
                                     : "authentication: no challenge or verdict from the peer "
                                       "within 10 s (is it a podium listener with a secret?)");
    });
    start_setup_locked();
    return;
  }
  start_session_locked();
}

void SocketLink::auth_failed_locked(const std::string& why) {
  refused_locked(ChannelErrc::kAuthFailed, "authentication failed: " + why);
}

void SocketLink::refused_locked(ChannelErrc code, const std::string& why) {
  spdlog::error("channel: link to {}: {}", to_text_, why);
  std::vector<Outgoing> back;
  queue_.drain_into(back);
  failed_locked(why);  // idle now: the queue is empty
  if (back.empty()) return;
  // hand_back() may call into the sender's code: not under mu_. The io thread that runs
  // this handler holds no other lock, so a post keeps the order simple.
  asio::post(core_->io, [core = core_, back = std::move(back), code, why]() mutable {
    hand_back(*core, back, code, why);
  });
}

// The setup (CH-8, CH-9) of SocketLink is in link_tls.cc.

void SocketLink::start_session_locked() {
  if (mode_ == Mode::kDuplex) {
    lend_locked();
    return;
  }
  first_read_ = true;
  wire::Hello hello;
  hello.session_id = session_id_;
  {
    std::lock_guard core_lock(core_->mu);
    hello.listen_address = core_->self_address;
  }
  // GW-2: a gateway routes by the address a connection is for; a proc's address carries an
  // incarnation, a worker's (which a gateway serves itself) none.
  if (mode_ != Mode::kDial || to_.incarnation != 0) hello.to = to_text_;
  lend_ok_ = false;
  lend_from_ = 0;
  if (mode_ == Mode::kDial && dial_.transport == Transport::kUnix &&
      core_->config.lend_min_bytes > 0) {
    // CH-25: offer to lend; the receiver proves it can read our memory by reading this.
    static const uint64_t probe = [] {
      std::random_device rd;
      return uint64_t(rd()) << 32 | rd() | 1;
    }();
    hello.flags |= wire::kHelloLend;
    hello.probe_addr = reinterpret_cast<uintptr_t>(&probe);
    hello.probe_value = probe;
  }
  hello_.clear();
  wire::encode(hello, hello_);
  hello_off_ = 0;
  // Everything not acknowledged goes again. A new session streams at once; a resumed one
  // first learns from HelloAck what the peer already delivered, so that a reconnect does not
  // resend a whole backlog the peer has (it would drop the duplicates, but late).
  written_ = offset_ = 0;
  holding_ = resumed_;
  resumed_ = true;
  decoder_.reset();
  if (tls_ && tls_->input_buffered()) {
    // Bytes that came with the end of the TLS setup: decode them before reading more.
    asio::post(core_->io, [self = std::static_pointer_cast<SocketLink>(shared_from_this()),
                           gen = gen_] { self->on_read(gen, {}, 0); });
  } else {
    start_read_locked();
  }
  flush_locked();
}

void SocketLink::push_locked() {
  if (!write_waiting_) flush_locked();
}

void SocketLink::close_locked() {
  ++gen_;
  authenticating_ = false;
  auth_timer_.cancel();
  std::error_code ec;
  resolver_.cancel();
  socket_.close(ec);  // no read lands in tls_'s input ring after this
  setup_.reset();     // before the session it drives
  tls_.reset();
  endpoints_.clear();
  write_waiting_ = false;
  hello_.clear();
  hello_off_ = 0;
  lend_ok_ = false;  // CH-26: what was lent on this connection is no longer the peer's to pull
}

bool SocketLink::lent_locked(size_t i) {
  if (!lend_ok_ || i >= queue_.size() || (i >= written_ && !(i == written_ && offset_ > 0))) {
    return false;
  }
  size_t min = lend_min_locked(queue_[i]);
  for (const Buffer& p : queue_[i].env.parts) {
    if (wire::lends(p, min)) return true;
  }
  return false;
}

size_t SocketLink::lent_parts_locked() {
  size_t n = 0;
  size_t end = std::min(queue_.size(), written_ + (offset_ > 0 ? 1 : 0));
  for (size_t i = 0; i < end; ++i) {
    size_t min = lend_min_locked(queue_[i]);
    for (const Buffer& p : queue_[i].env.parts) n += wire::lends(p, min) ? 1 : 0;
  }
  return n;
}

void SocketLink::start_read_locked() {
  auto into = tls_ ? tls_->input_space() : decoder_.prepare();
  read_into_ = into.data();
  socket_.async_read_some(
      asio::buffer(into.data(), into.size()),
      [self = std::static_pointer_cast<SocketLink>(shared_from_this()), gen = gen_](
          const std::error_code& ec, size_t n) { self->on_read(gen, ec, n); });
}

void SocketLink::on_read(uint64_t gen, const std::error_code& ec, size_t n) {
  std::lock_guard lock(mu_);
  if (gen != gen_ || state_ != State::kConnected) return;
  if (ec) {
    failed_locked(ec == asio::error::eof ? "connection closed by peer" : "read: " + ec.message());
    return;
  }
  if (tls_) {
    tls_->commit_input(n);
    for (;;) {
      auto r = tls_->read(decoder_.prepare());
      if (r.n > 0) {
        decoder_.commit(r.n);
        if (!take_acks_locked()) return;
      }
      if (r.failed) {
        failed_locked("TLS: " + tls_->error());
        return;
      }
      if (r.closed) {
        failed_locked("connection closed by peer");
        return;
      }
      if (r.n == 0) break;
    }
    start_read_locked();
    return;
  }
  if (std::exchange(first_read_, false) && n >= 4 && read_into_) {
    if (std::memcmp(read_into_, "PDMA", 4) == 0) {
      // A listener that authenticates (CH-8) greets with a challenge; we hold no secret.
      auth_failed_locked(secret_required_message(to_text_));
      return;
    }
    if (std::memcmp(read_into_, "PDMT", 4) == 0) {  // a TLS listener's greeting (CH-9)
      refused_locked(ChannelErrc::kTlsFailed, tls_required_message(to_text_));
      return;
    }
  }
  decoder_.commit(n);
  if (!take_acks_locked()) return;
  start_read_locked();
}

bool SocketLink::take_acks_locked() {
  wire::RawFrame frame;
  for (;;) {
    auto ready = decoder_.next(frame);
    Result<wire::Message> m;
    if (ready && !*ready) return true;
    if (ready) m = wire::decode(std::move(frame));
    const Error* bad = !ready ? &ready.error() : !m ? &m.error() : nullptr;
    if (bad) {
      core_->link_warnings.warn("channel: link to {}: bad frame from the peer ({}); reconnecting",
                                to_text_, bad->message);
      failed_locked("bad frame from the peer: " + bad->message);
      return false;
    }
    if (auto* ack = std::get_if<wire::Ack>(&*m)) {
      acked_locked(ack->seq);
    } else if (auto* hello_ack = std::get_if<wire::HelloAck>(&*m)) {
      acked_locked(hello_ack->delivered_seq);
      if ((hello_ack->flags & wire::kAckPull) && !hello_.empty() &&
          dial_.transport == Transport::kUnix && core_->config.lend_min_bytes > 0) {
        // CH-25: frames not yet begun go lent; one half on the wire keeps its inline form.
        lend_ok_ = true;
        lend_from_ = offset_ > 0 ? queue_[written_].seq + 1 : 0;
      }
      reset_backoff_locked();
      holding_ = false;
      flush_locked();
      if (state_ != State::kConnected) return false;  // the write failed
    } else {
      core_->link_warnings.warn("channel: link to {}: the peer sent a frame only a dialler "
                                "sends; reconnecting", to_text_);
      failed_locked("protocol error: the peer sent Hello or Data");
      return false;
    }
  }
}

void SocketLink::on_writable(uint64_t gen, const std::error_code& ec) {
  std::lock_guard lock(mu_);
  if (gen != gen_ || state_ != State::kConnected) return;
  write_waiting_ = false;
  if (ec) {
    failed_locked("write: " + ec.message());
    return;
  }
  flush_locked();
}

void SocketLink::flush_locked() {
  if (authenticating_) {  // CH-8, CH-9: frames go out once the peer accepted us
    if (tls_) send_tls_locked();
    return;
  }
  while (state_ == State::kConnected && !write_waiting_) {
    bool hello_left = hello_off_ < hello_.size();
    size_t end = holding_ ? written_ : queue_.size();  // frames that may go out now
    if (!hello_left && written_ == end) {
      if (tls_ && tls_->output_pending()) send_tls_locked();
      return;
    }
    // Encode the heads of a batch of frames first: heads_ may move while it grows.
    heads_.clear();
    head_ends_.clear();
    frame_bytes_.clear();
    size_t batch_bytes = 0;
    for (size_t i = written_; i < end && batch_bytes < kBatchBytes &&
                              head_ends_.size() < kMaxIov;
         ++i) {
      const Outgoing& o = queue_[i];
      size_t start = heads_.size();
      size_t lend_min = lend_min_locked(o);
      wire::encode_data(o.seq, o.env, heads_, lend_min);
      size_t bytes = heads_.size() - start;
      for (const Buffer& p : o.env.parts) bytes += wire::lends(p, lend_min) ? 0 : p.size();
      head_ends_.push_back(heads_.size());
      frame_bytes_.push_back(bytes);
      batch_bytes += bytes;
    }
    // Gather the unsent bytes: the rest of the Hello, then the frames, less the offset_
    // bytes of the first one already sent. offset_ > 0 implies the Hello is out.
    iov_.clear();
    size_t total = 0, skip = offset_;
    auto add = [&](const std::byte* p, size_t n) {
      if (skip >= n) {
        skip -= n;
      } else if (iov_.size() < kMaxIov) {
        iov_.push_back({const_cast<std::byte*>(p + skip), n - skip});
        total += n - skip;
        skip = 0;
      }
    };
    if (hello_left) {
      iov_.push_back({hello_.data() + hello_off_, hello_.size() - hello_off_});
      total += hello_.size() - hello_off_;
    }
    for (size_t k = 0, head_start = 0; k < head_ends_.size(); head_start = head_ends_[k++]) {
      add(heads_.data() + head_start, head_ends_[k] - head_start);
      size_t lend_min = lend_min_locked(queue_[written_ + k]);
      for (const Buffer& p : queue_[written_ + k].env.parts) {
        if (!p.empty() && !wire::lends(p, lend_min)) add(p.data(), p.size());
      }
    }
    ssize_t n = tls_ ? tls_->write(socket_.native_handle(), iov_.data(), iov_.size())
                     : send_iov(socket_.native_handle(), iov_.data(), iov_.size());
    if (n < 0) {
      failed_locked(tls_ && n == -EPROTO ? "TLS: " + tls_->error()
                                         : errno_error("write", int(-n)).message);
      return;
    }
    // Advance the cursor over the n bytes written.
    size_t left = size_t(n);
    if (hello_left) {
      size_t c = std::min(left, hello_.size() - hello_off_);
      hello_off_ += c;
      left -= c;
    }
    for (size_t k = 0; k < frame_bytes_.size() && left > 0; ++k) {
      size_t rest = frame_bytes_[k] - offset_;
      if (left < rest) {
        offset_ += left;
        break;
      }
      left -= rest;
      offset_ = 0;
      ++written_;
    }
    // The socket buffer is full (or, with TLS, holds back ciphertext): finish on the io_context.
    if (size_t(n) < total || (tls_ && tls_->output_pending())) {
      write_waiting_ = true;
      socket_.async_wait(
          Socket::wait_write,
          [self = std::static_pointer_cast<SocketLink>(shared_from_this()), gen = gen_](
              const std::error_code& ec) { self->on_writable(gen, ec); });
    }
  }
}

}  // namespace podium::channel::internal

namespace podium::channel {

FlushLater::FlushLater() : outer_(internal::tls_flush_later) { internal::tls_flush_later = true; }
FlushLater::~FlushLater() { internal::tls_flush_later = outer_; }
bool FlushLater::active() { return internal::tls_flush_later; }

}  // namespace podium::channel
