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

namespace {

// One channel URL of a worker address: (address, fd or -1).
Result<std::pair<Address, int>> parse_worker_url(std::string_view whole, std::string_view url) {
  auto refuse = [&](std::string why) {
    return std::unexpected(make_error(ChannelErrc::kBadAddress,
                                      "worker address '" + std::string(whole) + "': " + why));
  };
  if (url.starts_with("ipc://")) {
    std::string_view path = url.substr(6);
    if (path.empty()) return refuse("ipc:// needs a socket path");
    std::string target = path.find('/') == std::string_view::npos ? "@" + std::string(path)
                                                                    : std::string(path);
    auto a = Address::parse("unix:" + target);
    if (!a) return refuse(a.error().message);
    return std::pair{*a, -1};
  }
  std::string_view rest = url;
  if (rest.starts_with("tcp://")) {
    rest = rest.substr(6);
  } else if (rest.starts_with("tcp:")) {
    rest = rest.substr(4);
  } else if (auto scheme = rest.find("://"); scheme != std::string_view::npos) {
    return refuse("unknown scheme '" + std::string(rest.substr(0, scheme)) +
                  "://' (expected tcp://HOST:PORT, tcp://HOST:fdN or ipc://PATH)");
  }
  auto colon = rest.rfind(':');
  if (colon != std::string_view::npos && rest.substr(colon + 1).starts_with("fd")) {
    std::string_view num = rest.substr(colon + 3);
    int fd = -1;
    auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), fd);
    if (num.empty() || ec != std::errc() || end != num.data() + num.size() || fd < 0) {
      return refuse("'" + std::string(rest.substr(colon + 1)) +
                    "' is not a descriptor (tcp://HOST:fdN)");
    }
    auto a = Address::parse("tcp:" + std::string(rest.substr(0, colon)) + ":0");
    if (!a) return refuse(a.error().message);
    return std::pair{*a, fd};
  }
  auto a = Address::parse("tcp:" + std::string(rest));
  if (!a) return refuse("expected tcp://HOST:PORT, ipc://PATH, tcp://HOST:fdN or DIAL@BIND (" +
                        a.error().message + ")");
  if (a->incarnation != 0) return refuse("a worker address has no incarnation");
  return std::pair{*a, -1};
}

}  // namespace

Result<WorkerAddress> parse_worker_address(std::string_view text) {
  // The '@' that splits DIAL@BIND is the one a second URL follows (an abstract ipc name or a
  // path may hold '@' too).
  size_t at = std::string_view::npos;
  for (size_t i = text.find('@'); i != std::string_view::npos; i = text.find('@', i + 1)) {
    std::string_view after = text.substr(i + 1);
    if (after.starts_with("tcp:") || after.starts_with("ipc://")) {
      at = i;
      break;
    }
  }
  WorkerAddress w;
  if (at == std::string_view::npos) {
    auto one = parse_worker_url(text, text);
    if (!one) return std::unexpected(one.error());
    w.dial = w.bind = one->first;
    w.fd = one->second;
    return w;
  }
  auto dial = parse_worker_url(text, text.substr(0, at));
  if (!dial) return std::unexpected(dial.error());
  auto bind = parse_worker_url(text, text.substr(at + 1));
  if (!bind) return std::unexpected(bind.error());
  if (dial->second >= 0) {
    return std::unexpected(make_error(ChannelErrc::kBadAddress,
                                      "worker address '" + std::string(text) +
                                          "': the dialled side of DIAL@BIND cannot be a "
                                          "descriptor"));
  }
  if (dial->first.transport != bind->first.transport) {
    return std::unexpected(make_error(ChannelErrc::kBadAddress,
                                      "worker address '" + std::string(text) +
                                          "': DIAL and BIND must both be tcp or both ipc"));
  }
  w.dial = dial->first;
  w.bind = bind->first;
  w.fd = bind->second;
  w.alias = true;
  return w;
}

std::string worker_url(const Address& a) {
  if (a.transport == Transport::kUnix) return "ipc://" + (a.target.starts_with('@') ? a.target.substr(1) : a.target);
  if (a.transport == Transport::kTcp) {
    Address plain = a;
    plain.incarnation = 0;
    return "tcp://" + plain.to_string().substr(4);
  }
  return a.to_string();
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
