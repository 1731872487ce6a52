#include "podium/base/error.h"

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

Error errno_error(std::string_view what, int err) {
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(err);
  return make_error(BaseErrc::kIo, std::move(msg));
}

}  // namespace podium
