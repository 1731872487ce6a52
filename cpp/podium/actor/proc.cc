// Proc itself (proc.h): making one, sending, routing what arrives (AC-8, AC-11, AC-14), and
// stopping. The other concerns are in the files proc_impl.h lists.
#include "podium/actor/proc.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <random>

#include "podium/actor/proc_impl.h"

namespace podium::actor {

Error actor_error(ActorErrc code, const std::string& who, std::string_view why) {
  std::string msg = who;
  msg += ": ";
  msg += why;
  return make_error(code, std::move(msg));
}

Proc::Impl::Impl(const ProcConfig& config)
    : clock(config.clock), ended_kept(config.ended_actors_kept) {
  holding = config.hold_system_ops;
  inbox = std::make_unique<OrderedInbox>(io, clock, kOrderGapTimeout,
                                         [this](wire::Envelope&& env) {
                                           route_to_actor(std::move(env));
                                         });
}

// --- routing ---------------------------------------------------------------------------

void Proc::Impl::route(wire::Envelope&& env) {
  auto v = split_port_id(env.dest);
  if (!v) {
    bounce(std::move(env), v.error());
    return;
  }
  if (id.addr.incarnation != 0) {
    if (auto why = for_an_earlier_incarnation(v->addr)) {
      bounce(std::move(env), std::move(*why));
      return;
    }
  }
  if (v->local_key == system_key()) {
    if (v->port == kMailboxPort) {
      handle_system(std::move(env));
    } else {
      deliver_to_port(v->port, std::move(env));
    }
    return;
  }
  if (env.kind == static_cast<uint8_t>(MessageKind::kCall) && env.order_stream != 0) {
    inbox->route(std::move(env));  // AC-11: in order, then route_to_actor()
    return;
  }
  route_to_actor(std::move(env));
}

// For AC-14 (CH-12): a message for the proc that listened at this address before (same host and
// port, another incarnation) must not reach this proc's actors or ports, whose names and port
// numbers may well be the same as the dead one's. An address with no incarnation, or another
// host name, is not judged: it may be an alias of this one.
std::optional<Error> Proc::Impl::for_an_earlier_incarnation(std::string_view proc) const {
  if (proc == id_text) return std::nullopt;
  auto a = channel::Address::parse(proc);
  if (!a || a->incarnation == 0 || a->incarnation == id.addr.incarnation ||
      a->transport != id.addr.transport || a->target != id.addr.target ||
      a->port != id.addr.port) {
    return std::nullopt;
  }
  return make_error(ActorErrc::kProcExited,
                    "proc " + std::string(proc) + " has ended; its address is " + id_text + "'s now");
}

void Proc::Impl::route_to_actor(wire::Envelope&& env) {
  auto v = split_port_id(env.dest);
  if (!v) {
    bounce(std::move(env), v.error());
    return;
  }
  std::optional<Error> ended_why;
  auto cell = find(v->local_key, &ended_why);
  if (!cell) {
    if (ended_why) {
      bounce(std::move(env), std::move(*ended_why));
      return;
    }
    std::string why = "no actor '" + std::string(v->local_key) + "' in proc " + id_text;
    bounce(std::move(env), make_error(ActorErrc::kNoSuchActor, std::move(why)));
    return;
  }
  if (v->port != kMailboxPort) {
    bounce(std::move(env), make_error(ActorErrc::kNoSuchPort,
                                      "actor ports other than 0 live under proc[0]: " + env.dest));
    return;
  }
  enqueue(cell, Item{Item::Type::kMessage, std::move(env), nullptr});
}

std::string_view Proc::Impl::system_key() {
  static const std::string key = std::string(kSystemActorName) + "[0]";
  return key;
}

void Proc::Impl::deliver_to_port(uint64_t port, wire::Envelope&& env) {
  auto handler = ports.take(port);
  if (!handler) {
    // A reply that arrives after its caller gave up (or a second reply to a once-port).
    if (env.kind == static_cast<uint8_t>(MessageKind::kReply)) {
      spdlog::debug("podium: dropping reply for closed port {}", env.dest);
      return;
    }
    bounce(std::move(env), make_error(ActorErrc::kNoSuchPort,
                                      "port " + env.dest + " is closed or never existed"));
    return;
  }
  (*handler)(std::move(env));
}

// AC-8: answers an undeliverable message's reply port, else tells the hook.
void Proc::Impl::bounce(wire::Envelope&& env, Error why) {
  auto reply = reply_port_of(env);
  if (!reply.empty() && env.kind != static_cast<uint8_t>(MessageKind::kReply)) {
    uint64_t rank = 0;
    if (env.kind == static_cast<uint8_t>(MessageKind::kCall) && !env.parts.empty()) {
      if (auto h = decode_call_header(env.parts[0])) rank = h->rank;
    }
    self->send_reply(std::string(reply), rank, std::unexpected(std::move(why)));
    return;
  }
  std::shared_ptr<UndeliverableHook> hook;
  {
    std::lock_guard lock(hooks_mu);
    hook = undeliverable_hook;
  }
  if (hook) {
    (*hook)(env, why);
  } else {
    spdlog::warn("podium: undeliverable message from {} to {}: {}", env.sender, env.dest,
                 why.to_string());
  }
}

// --- AC-11, sender side ------------------------------------------------------------------

uint64_t Proc::Impl::stream_hash(std::string_view text) const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  h ^= stream_salt;
  return h == 0 ? 1 : h;
}

void Proc::Impl::stamp(wire::Envelope& env) {
  if (env.kind != static_cast<uint8_t>(MessageKind::kCall) || env.order_stream != 0) return;
  env.order_stream = self->sender_stream();
  env.order_seq = self->next_seq(env.order_stream, env.dest);
  // AC-16: the receiver learns which process sends on the stream.
  if (env.sender.empty()) {
    const std::string* me = internal::drive_tls().actor_text;
    env.sender = me ? *me : id_text;
  }
}

size_t Proc::max_frame_bytes() const { return impl_->net->config().max_frame_bytes; }

uint64_t Proc::sender_stream() const {
  auto& tls = internal::drive_tls();
  if (tls.actor_stream != 0) return tls.actor_stream;
  if (tls.actor_text) return impl_->stream_hash(*tls.actor_text);
  return impl_->proc_stream;
}

uint64_t Proc::next_seq(uint64_t stream, std::string_view dest) {
  uint64_t out = 0;
  impl_->seqs.next_seqs(stream, std::span<const std::string* const>(), dest, &out);
  return out;
}

void Proc::next_seqs(uint64_t stream, std::span<const std::string* const> dests,
                     std::string_view one, uint64_t* out) {
  impl_->seqs.next_seqs(stream, dests, one, out);
}

Proc::SeqSlots Proc::seq_slots(uint64_t stream, std::span<const std::string* const> dests) {
  return impl_->seqs.seq_slots(stream, dests);
}

void Proc::next_seqs(std::span<uint64_t* const> slots, uint64_t* out) {
  impl_->seqs.next_seqs(slots, out);
}

void Proc::forget_dests(std::span<const std::string> proc_keys) {
  impl_->seqs.forget_dests(proc_keys);
  impl_->inbox->forget_senders(proc_keys);  // AC-16
}

Proc::OrderingState Proc::ordering_state() const {
  return OrderingState{impl_->seqs.stream_count(), impl_->inbox->stream_count()};
}

size_t Proc::ended_actor_count() const {
  std::shared_lock lock(impl_->cells_mu);
  return impl_->ended.size();
}

// --- Proc ------------------------------------------------------------------------------

void Context::reply(std::vector<Buffer> value) {
  if (replied_ || reply_port_.empty()) return;
  replied_ = true;
  proc_.send_reply(reply_port_, rank(), std::move(value));
}

void Context::reply_error(Error error) {
  if (replied_ || reply_port_.empty()) return;
  replied_ = true;
  proc_.send_reply(reply_port_, rank(), std::unexpected(std::move(error)));
}

Proc::Proc() = default;

Proc::~Proc() {
  if (impl_) stop();
}

namespace {

// GW-1: opens the duplex to the gateway `via` and waits for the address it names this proc
// by. The executor runs the io_context from here on (the duplex needs it).
Result<channel::Address> attach_via(Proc::Impl& impl, const channel::Address& via,
                                    std::chrono::milliseconds timeout) {
  struct Wait {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<channel::Address> routed;
    std::string last_error;
  };
  auto wait = std::make_shared<Wait>();
  impl.executor.start();
  impl.net->start_via([wait](Result<channel::Address> event) {
    std::lock_guard lock(wait->mu);
    if (event) {
      if (!wait->routed) wait->routed = *event;
      wait->cv.notify_all();
    } else {
      wait->last_error = event.error().message;
    }
  });
  std::unique_lock lock(wait->mu);
  if (!wait->cv.wait_for(lock, timeout, [&] { return wait->routed.has_value(); })) {
    return std::unexpected(make_error(
        channel::ChannelErrc::kConnectFailed,
        "attach failed: the gateway at " + channel::worker_url(via) + " did not open a duplex "
            "within " + std::to_string(timeout.count()) + " ms" +
            (wait->last_error.empty() ? "" : ": " + wait->last_error)));
  }
  return *wait->routed;
}

}  // namespace

Result<std::unique_ptr<Proc>> Proc::make(ProcConfig config) {
  std::unique_ptr<Proc> proc(new Proc());
  proc->impl_ = std::make_unique<Impl>(config);
  Impl* impl = proc->impl_.get();
  impl->self = proc.get();
  if (!config.channel.clock) config.channel.clock = config.clock;
  impl->net = std::make_unique<channel::Net>(
      impl->io, config.channel,
      [impl](wire::Envelope&& env) {
        impl->received_remote.fetch_add(1, std::memory_order_relaxed);
        internal::drive_tls().batch_proc = impl;
        impl->route(std::move(env));
      },
      [impl](wire::Envelope&& env, Error why) { impl->bounce(std::move(env), std::move(why)); });
  impl->net->on_batch_end([impl] {
    auto& tls = internal::drive_tls();
    tls.batch_proc = nullptr;
    if (auto cell = std::static_pointer_cast<Mailbox>(std::exchange(tls.batch_cell, nullptr))) {
      impl->drain(cell);
    }
  });
  Result<channel::Address> bound;
  if (config.via) {
    bound = attach_via(*impl, *config.via, config.via_timeout);
  } else {
    bound = impl->net->listen(config.listen, config.listen_fd);
    if (bound && config.advertise) {
      channel::Address advertised = *config.advertise;
      if (advertised.transport == channel::Transport::kTcp && advertised.port == 0) {
        advertised.port = bound->port;
      }
      bound = advertised;
    }
  }
  if (!bound) return std::unexpected(bound.error());
  if (config.gateway) {
    channel::Address self = *config.gateway;
    if (self.port == 0) self.port = bound->port;
    impl->net->serve_as_gateway(self);
    impl->gateway_addr = self;
  }
  impl->id = ProcId{*bound};
  impl->id_text = impl->id.to_string();
  impl->system_id = ActorId{impl->id, std::string(kSystemActorName), 0};
  impl->port_prefix = impl->system_id.to_string() + ":";
  impl->stream_salt = (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                      std::random_device{}() ^ static_cast<uint64_t>(::getpid());
  impl->proc_stream = impl->stream_hash(impl->id_text);
  if (!config.via) impl->executor.start();  // attach_via() started it
  return proc;
}

const ProcId& Proc::id() const { return impl_->id; }
asio::io_context& Proc::io() { return impl_->io; }
Executor& Proc::executor() { return impl_->executor; }

void Proc::send(const channel::Address& to, wire::Envelope env) {
  impl_->stamp(env);
  if (to == impl_->id.addr) {
    impl_->route(std::move(env));
  } else {
    impl_->sent_remote.fetch_add(1, std::memory_order_relaxed);
    impl_->net->send(to, std::move(env));
  }
}

void Proc::send(wire::Envelope env) {
  impl_->stamp(env);
  auto v = split_port_id(env.dest);
  if (!v) {
    impl_->bounce(std::move(env), v.error());
    return;
  }
  if (v->addr == impl_->id_text) {
    impl_->route(std::move(env));
    return;
  }
  // Replies go to few distinct procs; remember the last address parsed on this thread.
  auto& tls = internal::drive_tls();
  if (v->addr != tls.dest_text) {
    auto addr = channel::Address::parse(v->addr);
    if (!addr) {
      impl_->bounce(std::move(env), addr.error());
      return;
    }
    tls.dest_text.assign(v->addr);
    tls.dest_addr = std::move(*addr);
  }
  impl_->sent_remote.fetch_add(1, std::memory_order_relaxed);
  impl_->net->send(tls.dest_addr, std::move(env));
}

void Proc::forget_peer(const channel::Address& peer, const std::string& why) {
  if (impl_->net) impl_->net->forget(peer, why);
  std::string key = peer.to_string();
  impl_->inbox->forget_senders(std::span<const std::string>(&key, 1));  // AC-16
}

size_t Proc::link_count() const { return impl_->net ? impl_->net->link_count() : 0; }

channel::NetStats Proc::channel_stats() const {
  return impl_->net ? impl_->net->stats() : channel::NetStats{};
}

Result<channel::Address> Proc::serve_gateway(const channel::Address& addr) {
  auto refuse = [&](std::string why) -> Result<channel::Address> {
    return std::unexpected(make_error(channel::ChannelErrc::kListenFailed,
                                      "serve on " + addr.to_string() + ": " + std::move(why)));
  };
  if (!impl_->net) return refuse("this proc has no network");
  if (addr.transport != channel::Transport::kTcp) return refuse("a gateway listens on TCP");
  if (impl_->net->config().via) {
    return refuse("this process reaches its job through a gateway itself (attach)");
  }
  std::lock_guard lock(impl_->gateway_mu);
  if (impl_->gateway_addr) {
    if (addr.port == 0 || *impl_->gateway_addr == addr) return *impl_->gateway_addr;
    return refuse("it serves as a gateway on " + impl_->gateway_addr->to_string() + " already");
  }
  auto bound = impl_->net->listen(addr);
  if (!bound) return std::unexpected(bound.error());
  impl_->net->serve_as_gateway(*bound);
  impl_->gateway_addr = *bound;
  return *bound;
}

Proc::Traffic Proc::traffic() const {
  return Traffic{impl_->sent_remote.load(std::memory_order_relaxed),
                 impl_->received_remote.load(std::memory_order_relaxed)};
}

void Proc::send_reply(std::string_view reply_port, uint64_t rank,
                      Result<std::vector<Buffer>> value) {
  wire::Envelope env;
  env.kind = static_cast<uint8_t>(MessageKind::kReply);
  env.dest.assign(reply_port);
  if (const std::string* me = current_actor_text()) env.sender = *me;
  ReplyHeader h;
  h.rank = rank;
  h.ok = value.has_value();
  if (value) {
    env.parts.reserve(value->size() + 1);
    env.parts.push_back(Buffer());
    for (auto& b : *value) env.parts.push_back(std::move(b));
  } else {
    h.error = std::move(value.error());
    env.parts.push_back(Buffer());
  }
  env.parts[0] = encode_reply_header(h);
  send(std::move(env));
}

Result<ActorId> Proc::spawn(std::string name, uint32_t index, ActorFactory factory) {
  auto cell = impl_->make_cell(std::move(name), index, std::move(factory));
  if (!cell) return std::unexpected(cell.error());
  ActorId id = (*cell)->id;
  impl_->enqueue(*cell, Impl::Item{Impl::Item::Type::kConstruct, wire::Envelope{}, nullptr});
  return id;
}

Status Proc::stop_actor(std::string_view local_key, std::function<void(Status)> done) {
  std::optional<Error> ended_why;
  auto cell = impl_->find(local_key, &ended_why);
  if (!cell) {
    if (ended_why) return std::unexpected(*ended_why);
    return std::unexpected(make_error(
        ActorErrc::kNoSuchActor,
        "no actor '" + std::string(local_key) + "' in proc " + impl_->id_text));
  }
  impl_->enqueue(cell, Impl::Item{Impl::Item::Type::kStop, wire::Envelope{}, std::move(done)});
  return ok();
}

void Proc::fail_actor(std::string_view local_key, Error cause) {
  auto cell = impl_->find(local_key, nullptr);
  if (!cell) return;  // already stopped or failed
  Impl::Item item;
  item.type = Impl::Item::Type::kFail;
  item.cause = std::move(cause);
  impl_->enqueue(cell, std::move(item));
}

PortId Proc::open_port(PortHandler handler, bool once) {
  return PortId{impl_->system_id, impl_->ports.open(std::move(handler), once)};
}

std::string Proc::port_text(uint64_t port) const {
  std::string out = impl_->port_prefix;
  out += std::to_string(port);
  return out;
}

void Proc::close_port(uint64_t port) { impl_->ports.close(port); }

bool Proc::wait_exit_requested(std::chrono::nanoseconds timeout) {
  return impl_->exit_requested.wait_for(timeout);
}

void Proc::request_exit() { impl_->exit_requested.set(); }

void Proc::stop() {
  if (impl_->stopped.exchange(true)) return;
  impl_->exit_requested.set();
  if (impl_->net) impl_->net->stop();
  impl_->executor.stop();
  // AC-17: no thread that helps drain a mailbox is inside this proc past this point.
  impl_->help_gate->close_and_wait();
  {
    std::unique_lock lock(impl_->cells_mu);
    impl_->cells.clear();
  }
  // Nothing will be delivered to a port any more: their handlers go now, while the program
  // still runs, rather than in a destructor at exit (AC-13).
  impl_->ports.close_all();
}

}  // namespace podium::actor
