#include "podium/base/error.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>

namespace podium {

std::string_view subsystem_name(Subsystem s) {
  switch (s) {
    case Subsystem::kBase: return "base";
    case Subsystem::kNdslice: return "ndslice";
    case Subsystem::kWire: return "wire";
    case Subsystem::kChannel: return "channel";
    case Subsystem::kActor: return "actor";
    case Subsystem::kMesh: return "mesh";
    case Subsystem::kHost: return "host";
    case Subsystem::kSupervision: return "supervision";
    case Subsystem::kData: return "data";
  }
  return "unknown";
}

std::string Error::to_string() const {
  std::string out(subsystem_name(subsystem));
  out += '/';
  out += std::to_string(code);
  out += ": ";
  out += message;
  return out;
}

std::string errno_text(int err) {
  std::string text = std::strerror(err);
  rlimit nofile = {};
  if (err != EMFILE || ::getrlimit(RLIMIT_NOFILE, &nofile) != 0) return text;
  auto limit = [](rlim_t v) {
    return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v);
  };
  return text + " (this process reached its RLIMIT_NOFILE of " + limit(nofile.rlim_cur) +
         " descriptors, hard limit " + limit(nofile.rlim_max) +
         ": raise the hard limit, e.g. `ulimit -Hn` as root or LimitNOFILE= of a systemd unit)";
}

Error errno_error(std::string_view what, int err) {
  std::string msg(what);
  msg += ": ";
  msg += errno_text(err);
  return make_error(BaseErrc::kIo, std::move(msg));
}

}  // namespace podium
