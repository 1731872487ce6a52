// The process's data-plane engine, restricted to the control plane's network device (DA-21),
// and the lease settings: see data_internal.h.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstring>
#include <mutex>
#include <string>

#include "common.h"
#include "data_internal.h"
#include "podium/channel/address.h"
#include "podium/data/lease.h"
#include "podium/mesh/runtime.h"

namespace podium::python::dataplane {
namespace {

// The name of the network interface that holds `host` (an IP literal or a name), or "".
std::string interface_of(const std::string& host) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return {};
  std::string found;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) == 0) {
    for (addrinfo* a = res; a != nullptr && found.empty(); a = a->ai_next) {
      for (ifaddrs* i = ifs; i != nullptr && found.empty(); i = i->ifa_next) {
        if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != a->ai_family) continue;
        if (a->ai_family == AF_INET) {
          auto* x = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
          auto* y = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
          if (x->sin_addr.s_addr == y->sin_addr.s_addr) found = i->ifa_name;
        } else if (a->ai_family == AF_INET6) {
          auto* x = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
          auto* y = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
          if (std::memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr) == 0) {
            found = i->ifa_name;
          }
        }
      }
    }
    ::freeifaddrs(ifs);
  }
  ::freeaddrinfo(res);
  return found;
}

// DA-21: the network device UCX may use in this process: the interface of the address its
// control plane listens on, so that UCX's TCP transport connects, and listens, only where
// the job's traffic goes (a wildcard address stands for default_host_address()). A proc on
// a Unix socket belongs to a job of one host: loopback ("lo"). "" when no interface holds
// the address (a NAT'ed DIAL@BIND address): UCX's default, every device.
std::string control_plane_device() {
  const auto& addr = mesh::Runtime::get().proc().id().addr;
  if (addr.transport != channel::Transport::kTcp) return "lo";
  std::string host = addr.target;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || host == "0.0.0.0" || host == "::") host = podium::default_host_address();
  return interface_of(host);
}

}  // namespace

// DA-48: the numeric address of the control plane's host, when a local interface holds it.
std::string control_plane_ip() {
  const auto& addr = mesh::Runtime::get().proc().id().addr;
  if (addr.transport != channel::Transport::kTcp) return {};
  std::string host = addr.target;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || host == "0.0.0.0" || host == "::") host = podium::default_host_address();
  if (interface_of(host).empty()) return {};
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, nullptr, &res) != 0 || res == nullptr) return {};
  char ip[NI_MAXHOST] = "";
  bool ok = ::getnameinfo(res->ai_addr, res->ai_addrlen, ip, sizeof ip, nullptr, 0,
                          NI_NUMERICHOST) == 0;
  ::freeaddrinfo(res);
  return ok ? std::string(ip) : std::string();
}

// This process's engine (DA-1), restricted to the control plane's device (DA-21): made
// only once the runtime runs, since the device follows from the proc's address.
Result<data::Engine*> instance() {
  if (mesh::Runtime::current() == nullptr) {
    return std::unexpected(make_error(data::DataErrc::kUnavailable,
                                      "the podium runtime has not started in this process"));
  }
  static std::once_flag once;
  static std::string devices;
  static bool without_tcp = false;
  std::call_once(once, [] {
    devices = control_plane_device();
    // DA-51: podium's TCP path stands in for UCX's tcp transport, unless both are asked for
    // (PODIUM_RDMA_UCX_TCP=1: benchmarks comparing the two).
    const char* both = std::getenv("PODIUM_RDMA_UCX_TCP");
    without_tcp = tcp_path_on() && !(both != nullptr && std::string(both) == "1");
  });
  return data::Engine::instance(devices, without_tcp);
}

data::Engine& engine() {
  auto e = instance();
  if (!e) throw_error(e.error());
  return **e;
}

// Whether UCX can start here, before the runtime runs: a throwaway engine (no devices
// restricted), made once.
std::pair<bool, std::string> probe() {
  static std::once_flag once;
  static std::pair<bool, std::string> result;
  std::call_once(once, [] {
    auto e = data::Engine::make();
    result = e ? std::make_pair(true, std::string()) : std::make_pair(false, e.error().message);
  });
  return result;
}


LeaseSettings& lease_settings() {
  static auto* s = [] {
    auto c = data::LeaseConfig::from_env();
    auto* x = new LeaseSettings();
    x->ms = c.lease.count();
    x->max_bytes = c.max_bytes;
    return x;
  }();
  return *s;
}



std::atomic<uint64_t> g_checks_answered{0}, g_delayed_releases{0}, g_leased{0}, g_checked{0},
    g_released_on_revocation{0}, g_revocations_answered{0}, g_revocations_unconfirmed{0};


Error tagged(size_t op, const Error& e) {
  return Error{e.subsystem, e.code, "\x1f" + std::to_string(op) + "\x1f" + e.message};
}


}  // namespace podium::python::dataplane
