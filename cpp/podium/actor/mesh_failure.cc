#include "podium/actor/mesh_failure.h"

#include <string.h>
#include <unistd.h>

#include <msgpack.hpp>

#include "podium/actor/ids.h"
#include "podium/wire/peer_msgpack.h"

namespace podium::actor {

std::string MeshFailure::report() const {
  // The actor by its local key ("counter[1]"); the full ActorId is a field of its own.
  size_t hash = actor_id.rfind('#');
  std::string who = hash == std::string::npos ? actor_id : actor_id.substr(hash + 1);
  std::string out = "actor " + who + " of mesh '" + mesh_name + "' (rank " + std::to_string(rank);
  if (!point.empty()) out += " " + point;
  out += ", host " + host + ", pid " + std::to_string(pid) + ")";
  out += cause.starts_with("failed") ? " " : " failed: ";
  out += cause;
  return out;
}

Buffer encode_mesh_failure(const MeshFailure& f) {
  msgpack::sbuffer sb(256);
  msgpack::packer<msgpack::sbuffer> pk(sb);
  pk.pack_array(10);
  pk.pack(static_cast<uint8_t>(f.kind));
  pk.pack(f.mesh_name);
  pk.pack(f.actor_id);
  pk.pack(f.rank);
  pk.pack(f.point);
  pk.pack(f.host);
  pk.pack(f.pid);
  pk.pack(f.signal);
  pk.pack(f.exit_code);
  pk.pack(f.cause);
  return Buffer::copy_of(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(sb.data()), sb.size()));
}

Result<MeshFailure> decode_mesh_failure(const Buffer& b) {
  try {
    auto oh = msgpack::unpack(reinterpret_cast<const char*>(b.data()), b.size(), nullptr, nullptr,
                              wire::peer_unpack_limit(b.size()));  // WI-7
    const auto& o = oh.get();
    if (o.type != msgpack::type::ARRAY || o.via.array.size != 10) {
      return std::unexpected(make_error(ActorErrc::kBadArguments, "mesh failure is not a 10-array"));
    }
    MeshFailure f;
    const auto* a = o.via.array.ptr;
    uint8_t kind = 0;
    a[0].convert(kind);
    f.kind = kind == 1 ? MeshFailure::Kind::kProc : MeshFailure::Kind::kActor;
    a[1].convert(f.mesh_name);
    a[2].convert(f.actor_id);
    a[3].convert(f.rank);
    a[4].convert(f.point);
    a[5].convert(f.host);
    a[6].convert(f.pid);
    a[7].convert(f.signal);
    a[8].convert(f.exit_code);
    a[9].convert(f.cause);
    return f;
  } catch (const std::exception& e) {
    return std::unexpected(
        make_error(ActorErrc::kBadArguments, std::string("malformed mesh failure: ") + e.what()));
  }
}

const std::string& host_name() {
  static const std::string name = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return std::string("localhost");
    return std::string(buf);
  }();
  return name;
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  if (abbrev) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

}  // namespace podium::actor
