#include "podium/mesh/launch.h"

#include <dirent.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <msgpack.hpp>

#include <charconv>
#include <fstream>
#include <cstring>
#include <sstream>

#include "podium/wire/peer_msgpack.h"

namespace podium::mesh {
namespace {

Error launch_error(std::string msg) {
  return make_error(BaseErrc::kInvalidArgument, std::move(msg));
}

struct LaunchWire {
  std::string program;
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
  std::vector<std::string> unset;
  bool inherit_env = true;
  std::vector<std::pair<std::string, std::string>> bind;
  MSGPACK_DEFINE(program, argv, env, unset, inherit_env, bind);
};

constexpr long kMpolBind = 2;  // MPOL_BIND (linux/mempolicy.h)

Result<std::vector<int>> node_cpus(int node) {
  std::string path = "/sys/devices/system/node/node" + std::to_string(node) + "/cpulist";
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) {
    return std::unexpected(launch_error("NUMA node " + std::to_string(node) +
                                        " does not exist on this host (no " + path + ")"));
  }
  return parse_cpu_list(line);
}

Result<void> bind_cpus(const std::vector<int>& cpus, const std::string& what) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c >= CPU_SETSIZE) return std::unexpected(launch_error(what + ": CPU " + std::to_string(c) +
                                                              " is out of range"));
    CPU_SET(c, &set);
  }
  // Every thread of the process (LA-1): threads started before this keep no other mask.
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return std::unexpected(launch_error(what + ": cannot list /proc/self/task"));
  std::string failure;
  while (auto* e = readdir(d)) {
    int tid = 0;
    std::string_view name(e->d_name);
    if (std::from_chars(name.data(), name.data() + name.size(), tid).ec != std::errc{}) continue;
    if (sched_setaffinity(tid, sizeof(set), &set) != 0 && failure.empty()) {
      failure = std::strerror(errno);
    }
  }
  closedir(d);
  if (!failure.empty()) {
    return std::unexpected(launch_error(what + ": sched_setaffinity failed: " + failure));
  }
  return {};
}

Result<void> bind_memory(const std::vector<int>& nodes, const std::string& what) {
  unsigned long mask[16] = {};
  constexpr int kBits = static_cast<int>(sizeof(unsigned long) * 8);
  for (int n : nodes) {
    if (n >= kBits * 16) {
      return std::unexpected(launch_error(what + ": node " + std::to_string(n) + " is out of range"));
    }
    std::ifstream probe("/sys/devices/system/node/node" + std::to_string(n) + "/cpulist");
    if (!probe) {
      return std::unexpected(launch_error(what + ": NUMA node " + std::to_string(n) +
                                          " does not exist on this host"));
    }
    mask[n / kBits] |= 1UL << (n % kBits);
  }
  if (syscall(SYS_set_mempolicy, kMpolBind, mask, static_cast<unsigned long>(kBits * 16 + 1)) != 0) {
    return std::unexpected(launch_error(what + ": set_mempolicy failed: " + std::strerror(errno)));
  }
  return {};
}

}  // namespace

std::string ProcLaunch::encode() const {
  LaunchWire w{program, argv, env, unset, inherit_env, bind};
  std::stringstream out;
  msgpack::pack(out, w);
  return out.str();
}

Result<ProcLaunch> ProcLaunch::decode(std::string_view bytes) {
  LaunchWire w;
  try {
    msgpack::object_handle oh = msgpack::unpack(bytes.data(), bytes.size(), nullptr, nullptr,
                                                wire::peer_unpack_limit(bytes.size()));
    w = oh.get().as<LaunchWire>();
  } catch (const std::exception& e) {
    return std::unexpected(launch_error(std::string("malformed proc launch: ") + e.what()));
  }
  if (!w.program.empty() && w.argv.empty()) w.argv.push_back(w.program);
  if (w.program.empty() && (!w.argv.empty() || !w.unset.empty() || !w.inherit_env)) {
    // Removed variables and an empty environment are applied with the command (env(1)).
    return std::unexpected(launch_error("malformed proc launch: argv, removed variables or "
                                        "inherit_env=false without a program"));
  }
  for (const auto& [k, v] : w.env) {
    if (k.empty() || k.find('=') != std::string::npos) {
      return std::unexpected(launch_error("proc launch: bad environment variable name '" + k + "'"));
    }
  }
  auto bind = decode_bind(encode_bind(w.bind));  // the same checks as the proc's
  if (!bind) return std::unexpected(bind.error());
  return ProcLaunch{std::move(w.program), std::move(w.argv), std::move(w.env), std::move(w.unset),
                    w.inherit_env, std::move(w.bind)};
}

std::string encode_bind(const std::vector<std::pair<std::string, std::string>>& bind) {
  std::string out;
  for (const auto& [k, v] : bind) {
    if (!out.empty()) out += ';';
    out += k + "=" + v;
  }
  return out;
}

Result<std::vector<std::pair<std::string, std::string>>> decode_bind(std::string_view text) {
  std::vector<std::pair<std::string, std::string>> out;
  while (!text.empty()) {
    auto end = text.find(';');
    std::string_view item = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
    auto eq = item.find('=');
    if (eq == std::string_view::npos) {
      return std::unexpected(launch_error("proc_bind entry '" + std::string(item) +
                                          "' is not key=value"));
    }
    std::string key(item.substr(0, eq)), value(item.substr(eq + 1));
    if (key != "cpus" && key != "physcpubind" && key != "cpunodebind" && key != "membind") {
      return std::unexpected(launch_error("proc_bind key '" + key + "' is not one of cpus, "
                                          "physcpubind, cpunodebind, membind"));
    }
    auto list = parse_cpu_list(value);
    if (!list) {
      return std::unexpected(launch_error("proc_bind " + key + "=" + value + ": " +
                                          list.error().message));
    }
    out.emplace_back(std::move(key), std::move(value));
  }
  return out;
}

Result<std::vector<int>> parse_cpu_list(std::string_view text) {
  std::vector<int> out;
  auto bad = [&] {
    return std::unexpected(launch_error("'" + std::string(text) + "' is not a list such as 0-3,8"));
  };
  std::string_view rest = text;
  while (!rest.empty() && (rest.back() == '\n' || rest.back() == ' ')) rest.remove_suffix(1);
  if (rest.empty() || rest.back() == ',') return bad();
  while (!rest.empty()) {
    auto end = rest.find(',');
    std::string_view item = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view{} : rest.substr(end + 1);
    int lo = 0, hi = 0;
    auto dash = item.find('-');
    std::string_view a = item.substr(0, dash);
    std::string_view b = dash == std::string_view::npos ? a : item.substr(dash + 1);
    if (a.empty() || b.empty() ||
        std::from_chars(a.data(), a.data() + a.size(), lo).ptr != a.data() + a.size() ||
        std::from_chars(b.data(), b.data() + b.size(), hi).ptr != b.data() + b.size() || lo < 0 ||
        hi < lo || hi > 65535) {
      return bad();
    }
    for (int i = lo; i <= hi; ++i) out.push_back(i);
  }
  return out;
}

Result<void> apply_bind(std::string_view text) {
  auto bind = decode_bind(text);
  if (!bind) return std::unexpected(bind.error());
  for (const auto& [key, value] : *bind) {
    std::string what = "proc_bind " + key + "=" + value;
    auto list = parse_cpu_list(value);
    if (!list) return std::unexpected(list.error());
    if (key == "membind") {
      if (auto r = bind_memory(*list, what); !r) return r;
      continue;
    }
    std::vector<int> cpus;
    if (key == "cpunodebind") {
      for (int node : *list) {
        auto c = node_cpus(node);
        if (!c) return std::unexpected(launch_error(what + ": " + c.error().message));
        cpus.insert(cpus.end(), c->begin(), c->end());
      }
    } else {
      cpus = std::move(*list);
    }
    if (auto r = bind_cpus(cpus, what); !r) return r;
  }
  return {};
}

}  // namespace podium::mesh
