#include "podium/actor/message.h"

#include <msgpack.hpp>

#include "podium/actor/ids.h"
#include "podium/wire/peer_msgpack.h"

namespace podium::actor {
namespace {

Error bad_message(std::string_view what, const std::exception& e) {
  std::string msg = "malformed ";
  msg += what;
  msg += ": ";
  msg += e.what();
  return make_error(ActorErrc::kBadArguments, std::move(msg));
}

// Headers are tens of bytes: encode into a per-thread scratch buffer, then copy into one
// allocation that holds both the bytes and their reference count.
msgpack::sbuffer& scratch() {
  thread_local msgpack::sbuffer sb(256);
  sb.clear();
  return sb;
}

Buffer to_buffer(const msgpack::sbuffer& sb) {
  return Buffer::copy_of(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(sb.data()), sb.size()));
}

// Decoding into a per-thread zone that is reset after each use costs no allocation per
// message (msgpack::unpack's own zone mallocs 8 KiB each time).
class ScratchObject {
 public:
  explicit ScratchObject(const Buffer& b)
      : obj_(msgpack::unpack(zone(), reinterpret_cast<const char*>(b.data()), b.size(), nullptr,
                             nullptr, wire::peer_unpack_limit(b.size()))) {}  // WI-7
  ~ScratchObject() { zone().clear(); }
  const msgpack::object& get() const { return obj_; }

 private:
  static msgpack::zone& zone() {
    thread_local msgpack::zone z;
    return z;
  }
  msgpack::object obj_;
};

ScratchObject unpack(const Buffer& b) { return ScratchObject(b); }

}  // namespace

Buffer encode_call_header(std::string_view endpoint, uint64_t rank,
                          const std::vector<std::string>& labels,
                          const std::vector<size_t>& sizes) {
  msgpack::sbuffer& sb = scratch();
  msgpack::packer<msgpack::sbuffer> pk(sb);
  pk.pack_array(4);
  pk.pack_str(static_cast<uint32_t>(endpoint.size()));
  pk.pack_str_body(endpoint.data(), static_cast<uint32_t>(endpoint.size()));
  pk.pack(rank);
  pk.pack(labels);
  pk.pack_array(static_cast<uint32_t>(sizes.size()));
  for (size_t s : sizes) pk.pack(static_cast<uint64_t>(s));
  return to_buffer(sb);
}

Buffer encode_call_header(const CallHeader& h) {
  std::vector<size_t> sizes(h.sizes.begin(), h.sizes.end());
  return encode_call_header(h.endpoint, h.rank, h.labels, sizes);
}

Result<CallHeader> decode_call_header(const Buffer& b) {
  try {
    auto oh = unpack(b);
    const auto& o = oh.get();
    if (o.type != msgpack::type::ARRAY || o.via.array.size != 4) {
      return std::unexpected(make_error(ActorErrc::kBadArguments, "call header is not a 4-array"));
    }
    CallHeader h;
    o.via.array.ptr[0].convert(h.endpoint);
    o.via.array.ptr[1].convert(h.rank);
    o.via.array.ptr[2].convert(h.labels);
    o.via.array.ptr[3].convert(h.sizes);
    return h;
  } catch (const std::exception& e) {
    return std::unexpected(bad_message("call header", e));
  }
}

Buffer encode_reply_header(const ReplyHeader& h) {
  msgpack::sbuffer& sb = scratch();
  msgpack::packer<msgpack::sbuffer> pk(sb);
  if (h.ok) {
    pk.pack_array(2);
    pk.pack(h.rank);
    pk.pack(true);
  } else {
    pk.pack_array(5);
    pk.pack(h.rank);
    pk.pack(false);
    pk.pack(static_cast<uint8_t>(h.error.subsystem));
    pk.pack(h.error.code);
    pk.pack(h.error.message);
  }
  return to_buffer(sb);
}

Result<ReplyHeader> decode_reply_header(const Buffer& b) {
  try {
    auto oh = unpack(b);
    const auto& o = oh.get();
    if (o.type != msgpack::type::ARRAY || (o.via.array.size != 2 && o.via.array.size != 5)) {
      return std::unexpected(make_error(ActorErrc::kBadArguments, "reply header has a bad shape"));
    }
    ReplyHeader h;
    o.via.array.ptr[0].convert(h.rank);
    o.via.array.ptr[1].convert(h.ok);
    if (!h.ok) {
      if (o.via.array.size != 5) {
        return std::unexpected(make_error(ActorErrc::kBadArguments, "error reply without error"));
      }
      uint8_t subsystem = 0;
      o.via.array.ptr[2].convert(subsystem);
      o.via.array.ptr[3].convert(h.error.code);
      o.via.array.ptr[4].convert(h.error.message);
      h.error.subsystem = static_cast<Subsystem>(subsystem);
    }
    return h;
  } catch (const std::exception& e) {
    return std::unexpected(bad_message("reply header", e));
  }
}

std::string system_sender(const ProcId& proc) {
  return ActorId{proc, std::string(kSystemActorName), 0}.to_string();
}

Result<ProcId> system_sender_proc(std::string_view sender) {
  if (sender.empty()) {
    return std::unexpected(make_error(ActorErrc::kBadId, "the message names no sender"));
  }
  auto id = ActorId::parse(sender);
  if (!id) return std::unexpected(id.error());
  if (id->name != kSystemActorName || id->index != 0) {
    return std::unexpected(make_error(ActorErrc::kBadId, "sender " + std::string(sender) +
                                                             " is not a proc's system actor"));
  }
  return id->proc;
}

wire::Envelope system_message(const ProcId& from, const ProcId& to, const SystemHeader& h) {
  wire::Envelope env;
  env.kind = static_cast<uint8_t>(MessageKind::kSystem);
  env.sender = system_sender(from);
  env.dest = PortId{ActorId{to, std::string(kSystemActorName), 0}, kMailboxPort}.to_string();
  env.parts.push_back(encode_system_header(h));
  return env;
}

Buffer encode_system_header(const SystemHeader& h) {
  msgpack::sbuffer& sb = scratch();
  msgpack::packer<msgpack::sbuffer> pk(sb);
  pk.pack_array(3);
  pk.pack(h.op);
  pk.pack(h.args);
  pk.pack(h.numbers);
  return to_buffer(sb);
}

Result<SystemHeader> decode_system_header(const Buffer& b) {
  try {
    auto oh = unpack(b);
    const auto& o = oh.get();
    if (o.type != msgpack::type::ARRAY || o.via.array.size != 3) {
      return std::unexpected(make_error(ActorErrc::kBadArguments, "system header is not a 3-array"));
    }
    SystemHeader h;
    o.via.array.ptr[0].convert(h.op);
    o.via.array.ptr[1].convert(h.args);
    o.via.array.ptr[2].convert(h.numbers);
    return h;
  } catch (const std::exception& e) {
    return std::unexpected(bad_message("system header", e));
  }
}

std::string_view reply_port_of(const wire::Envelope& env) {
  for (const auto& [k, v] : env.headers) {
    if (k == kReplyHeader) return v;
  }
  return {};
}

}  // namespace podium::actor
