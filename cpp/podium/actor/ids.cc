#include "podium/actor/ids.h"

#include <charconv>

namespace podium::actor {
namespace {

Error bad_id(std::string_view what, std::string_view text) {
  std::string msg(what);
  msg += ": '";
  msg += text;
  msg += "'";
  return make_error(ActorErrc::kBadId, std::move(msg));
}

template <class Int>
bool parse_int(std::string_view s, Int& out) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

// "name[3]" -> ("name", 3)
Result<std::pair<std::string_view, uint32_t>> split_local_key(std::string_view key) {
  auto open = key.rfind('[');
  if (open == std::string_view::npos || key.empty() || key.back() != ']' || open == 0) {
    return std::unexpected(bad_id("actor key must look like name[index]", key));
  }
  uint32_t index = 0;
  if (!parse_int(key.substr(open + 1, key.size() - open - 2), index)) {
    return std::unexpected(bad_id("bad actor index", key));
  }
  return std::pair{key.substr(0, open), index};
}

}  // namespace

Status ActorId::check_name(std::string_view name) {
  if (name.empty()) return std::unexpected(bad_id("empty actor name", name));
  for (char c : name) {
    if (c == '#' || c == '[' || c == ']' || c == ':' || c == '\0') {
      return std::unexpected(bad_id("actor names may not contain '#', '[', ']' or ':'", name));
    }
  }
  return ok();
}

std::string ActorId::local_key() const {
  std::string out = name;
  out += '[';
  out += std::to_string(index);
  out += ']';
  return out;
}

std::string ActorId::to_string() const {
  std::string out = proc.to_string();
  out += '#';
  out += local_key();
  return out;
}

Result<ActorId> ActorId::parse(std::string_view text) {
  auto hash = text.rfind('#');
  if (hash == std::string_view::npos) return std::unexpected(bad_id("actor id without '#'", text));
  auto addr = channel::Address::parse(text.substr(0, hash));
  if (!addr) return std::unexpected(addr.error());
  auto key = split_local_key(text.substr(hash + 1));
  if (!key) return std::unexpected(key.error());
  return ActorId{ProcId{std::move(*addr)}, std::string(key->first), key->second};
}

std::string PortId::to_string() const {
  std::string out = actor.to_string();
  out += ':';
  out += std::to_string(port);
  return out;
}

Result<PortIdView> split_port_id(std::string_view text) {
  auto hash = text.rfind('#');
  if (hash == std::string_view::npos) return std::unexpected(bad_id("port id without '#'", text));
  auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon < hash) {
    return std::unexpected(bad_id("port id without ':port'", text));
  }
  PortIdView v;
  v.addr = text.substr(0, hash);
  v.local_key = text.substr(hash + 1, colon - hash - 1);
  if (!parse_int(text.substr(colon + 1), v.port)) {
    return std::unexpected(bad_id("bad port number", text));
  }
  return v;
}

Result<PortId> PortId::parse(std::string_view text) {
  auto v = split_port_id(text);
  if (!v) return std::unexpected(v.error());
  auto addr = channel::Address::parse(v->addr);
  if (!addr) return std::unexpected(addr.error());
  auto key = split_local_key(v->local_key);
  if (!key) return std::unexpected(key.error());
  return PortId{ActorId{ProcId{std::move(*addr)}, std::string(key->first), key->second}, v->port};
}

}  // namespace podium::actor
