#include "podium/channel/address.h"

#include <sys/un.h>

#include <charconv>
#include <random>

#include "podium/channel/net.h"

namespace podium::channel {
namespace {

// sun_path holds a NUL-terminated path, or a NUL then the abstract name.
constexpr size_t kMaxUnixTarget = sizeof(sockaddr_un{}.sun_path) - 1;

std::unexpected<Error> bad(std::string_view text, std::string_view why) {
  std::string msg = "bad address '";
  msg += text;
  msg += "': ";
  msg += why;
  return std::unexpected(make_error(ChannelErrc::kBadAddress, std::move(msg)));
}

}  // namespace

Result<Address> Address::parse(std::string_view text) {
  auto colon = text.find(':');
  if (colon == std::string_view::npos) return bad(text, "expected inproc:, unix: or tcp:");
  std::string_view scheme = text.substr(0, colon), rest = text.substr(colon + 1);
  Address a;
  if (scheme == "inproc") {
    if (rest.empty()) return bad(text, "empty inproc name");
    a.transport = Transport::kInproc;
    a.target = rest;
    return a;
  }
  if (scheme == "unix") {
    if (rest.empty() || rest == "@") return bad(text, "empty unix path");
    if (rest.size() > kMaxUnixTarget) {
      return bad(text, "unix path of " + std::to_string(rest.size()) + " bytes exceeds the " +
                           std::to_string(kMaxUnixTarget) + "-byte limit of sun_path");
    }
    if (rest.find('\0') != std::string_view::npos) return bad(text, "NUL in unix path");
    a.transport = Transport::kUnix;
    a.target = rest;
    return a;
  }
  if (scheme == "tcp") {
    uint64_t incarnation = 0;
    if (auto slash = rest.find('/'); slash != std::string_view::npos) {
      std::string_view inc = rest.substr(slash + 1);
      // One spelling per value, so that equal texts and equal addresses go together.
      if (inc.empty() || inc.size() > 16 || inc.front() == '0' ||
          inc.find_first_not_of("0123456789abcdef") != std::string_view::npos) {
        return bad(text, "a tcp incarnation is 1 to 16 lowercase hex digits, not led by 0");
      }
      std::from_chars(inc.data(), inc.data() + inc.size(), incarnation, 16);
      rest = rest.substr(0, slash);
    }
    auto last = rest.rfind(':');
    if (last == std::string_view::npos) return bad(text, "expected tcp:HOST:PORT");
    std::string_view host = rest.substr(0, last), port = rest.substr(last + 1);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    } else if (host.find(':') != std::string_view::npos) {
      return bad(text, "write an IPv6 host in brackets, as tcp:[::1]:PORT");
    }
    if (host.empty()) return bad(text, "empty tcp host");
    uint16_t p = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    if (port.empty() || ec != std::errc() || end != port.data() + port.size()) {
      return bad(text, "tcp port is not a number in 0..65535");
    }
    a.transport = Transport::kTcp;
    a.target = host;
    a.port = p;
    a.incarnation = incarnation;
    return a;
  }
  return bad(text,
             "unknown transport '" + std::string(scheme) + "' (expected inproc, unix or tcp)");
}

std::string Address::to_string() const {
  switch (transport) {
    case Transport::kInproc: return "inproc:" + target;
    case Transport::kUnix: return "unix:" + target;
    case Transport::kTcp: {
      bool v6 = target.find(':') != std::string::npos;
      std::string text =
          (v6 ? "tcp:[" + target + "]:" : "tcp:" + target + ":") + std::to_string(port);
      if (incarnation != 0) {
        char hex[17];
        auto [end, ec] = std::to_chars(hex, hex + sizeof hex, incarnation, 16);
        text += '/';
        text.append(hex, end);
      }
      return text;
    }
  }
  return "?";
}

uint64_t new_incarnation() {
  thread_local std::mt19937_64 gen = [] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd()};
    return std::mt19937_64(seq);
  }();
  uint64_t v = 0;
  while (v == 0) v = gen() & 0xffffffffULL;
  return v;
}

}  // namespace podium::channel
