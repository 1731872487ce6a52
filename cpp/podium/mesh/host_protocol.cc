#include "podium/mesh/host_protocol.h"

#include <optional>

#include "podium/mesh/errc.h"
#include "podium/ndslice/codec.h"

namespace podium::mesh::proto {

Error malformed(const std::string& op, const std::string& why) {
  return make_error(MeshErrc::kProtocol, op + ": " + why);
}

namespace {

// Reads a SystemHeader's fields in order; the first problem is kept and reported by done().
class Reader {
 public:
  // Exactly `texts` strings and `numbers` integers (npos: at least the ones read).
  Reader(const actor::SystemHeader& h, const char* op, size_t texts, size_t numbers)
      : h_(h), op_(op) {
    if (h.op != op) {
      fail("not a " + std::string(op) + " message (op '" + h.op + "')");
    } else if (h.args.size() != texts || h.numbers.size() != numbers) {
      fail("expected " + std::to_string(texts) + " texts and " + std::to_string(numbers) +
           " numbers, got " + std::to_string(h.args.size()) + " and " +
           std::to_string(h.numbers.size()));
    }
  }
  // At least `texts` strings and `numbers` integers; the rest read by the caller.
  struct AtLeast {};
  Reader(const actor::SystemHeader& h, const char* op, size_t texts, size_t numbers, AtLeast)
      : h_(h), op_(op) {
    if (h.op != op) {
      fail("not a " + std::string(op) + " message (op '" + h.op + "')");
    } else if (h.args.size() < texts || h.numbers.size() < numbers) {
      fail("expected at least " + std::to_string(texts) + " texts and " +
           std::to_string(numbers) + " numbers, got " + std::to_string(h.args.size()) +
           " and " + std::to_string(h.numbers.size()));
    }
  }

  std::string text() { return ok() ? h_.args[t_++] : std::string(); }
  uint64_t number() { return ok() ? h_.numbers[n_++] : 0; }
  bool flag(const char* what) {
    uint64_t v = number();
    if (v > 1) fail(std::string(what) + " is " + std::to_string(v) + ", not 0 or 1");
    return v != 0;
  }
  int32_t i32() { return static_cast<int32_t>(static_cast<uint32_t>(number())); }
  channel::Address address(const char* what) {
    std::string t = text();
    if (!ok()) return {};
    auto a = channel::Address::parse(t);
    if (!a) {
      fail(std::string(what) + " '" + t + "' is not an address: " + a.error().message);
      return {};
    }
    return *a;
  }
  ndslice::Extent extent() {
    std::string t = text();
    if (!ok()) return {};
    auto e = ndslice::decode<ndslice::Extent>(t);
    if (!e) {
      fail("bad extent: " + e.error().message);
      return {};
    }
    return *e;
  }
  size_t texts_left() const { return h_.args.size() - t_; }
  size_t numbers_left() const { return h_.numbers.size() - n_; }
  void fail(std::string why) {
    if (!error_) error_ = malformed(op_, std::move(why));
  }
  bool ok() const { return !error_; }

  template <class T>
  Result<T> done(T value) {
    if (error_) return std::unexpected(*error_);
    return value;
  }

 private:
  const actor::SystemHeader& h_;
  std::string op_;
  size_t t_ = 0, n_ = 0;
  std::optional<Error> error_;
};

uint64_t u(int64_t v) { return static_cast<uint64_t>(v); }
uint64_t u32(int32_t v) { return static_cast<uint64_t>(static_cast<uint32_t>(v)); }

}  // namespace

actor::SystemHeader HostAttach::encode() const {
  return {kOp, {controller.to_string(), advertise}, {host_mesh, host_index, lost_after_ms}};
}
Result<HostAttach> HostAttach::decode(const actor::SystemHeader& h) {
  Reader r(h, kOp, 2, 3);
  HostAttach m;
  m.controller = r.address("controller");
  m.advertise = r.text();
  m.host_mesh = r.number();
  m.host_index = r.number();
  m.lost_after_ms = r.number();
  return r.done(std::move(m));
}

actor::SystemHeader HostSpawn::encode() const {
  actor::SystemHeader h{kOp,
                        {controller.to_string(), name, ndslice::encode(extent)},
                        {request, proc_mesh, first, count}};
  h.args.insert(h.args.end(), launches.begin(), launches.end());
  return h;
}
Result<HostSpawn> HostSpawn::decode(const actor::SystemHeader& h) {
  Reader r(h, kOp, 3, 4, Reader::AtLeast{});
  HostSpawn m;
  m.controller = r.address("controller");
  m.name = r.text();
  m.extent = r.extent();
  m.request = r.number();
  m.proc_mesh = r.number();
  m.first = r.number();
  m.count = r.number();
  if (r.ok() && (m.first > m.extent.num_ranks() || m.count > m.extent.num_ranks() - m.first)) {
    r.fail("ranks [" + std::to_string(m.first) + ", +" + std::to_string(m.count) +
           ") are outside the extent " + m.extent.to_string());
  }
  if (r.ok() && h.numbers.size() != 4) {
    r.fail("expected 4 numbers, got " + std::to_string(h.numbers.size()));
  } else if (r.ok() && h.args.size() > 3) {
    if (h.args.size() != 3 + m.count) {
      r.fail("expected no launches or " + std::to_string(m.count) + ", got " +
             std::to_string(h.args.size() - 3));
    } else {
      m.launches.assign(h.args.begin() + 3, h.args.end());
    }
  }
  return r.done(std::move(m));
}

actor::SystemHeader HostKill::encode() const { return {kOp, {proc_key}, {u32(signal)}}; }
Result<HostKill> HostKill::decode(const actor::SystemHeader& h) {
  Reader r(h, kOp, 1, 1);
  HostKill m;
  m.proc_key = r.text();
  uint64_t sig = r.number();
  if (r.ok() && (sig == 0 || sig > 64)) r.fail("signal " + std::to_string(sig) + " is not 1..64");
  m.signal = static_cast<int32_t>(sig);
  return r.done(std::move(m));
}

actor::SystemHeader HostDetach::encode() const {
  return {kOp, {controller.to_string()}, {request, stop ? 1u : 0u}};
}
Result<HostDetach> HostDetach::decode(const actor::SystemHeader& h) {
  Reader r(h, kOp, 1, 2);
  HostDetach m;
  m.controller = r.address("controller");
  m.request = r.number();
  m.stop = r.flag("stop");
  return r.done(std::move(m));
}

actor::SystemHeader HostLookup::encode() const {
  return {kOp, {controller.to_string(), name}, {request}};
}
Result<HostLookup> HostLookup::decode(const actor::SystemHeader& h) {
  Reader r(h, kOp, 2, 1);
  HostLookup m;
  m.controller = r.address("controller");
  m.name = r.text();
  m.request = r.number();
  return r.done(std::move(m));
}

actor::SystemHeader ControllerBeat::encode() const { return {kOp, {controller.to_string()}, {}}; }
Result<ControllerBeat> ControllerBeat::decode(const actor::SystemHeader& h) {
  Reader r(h, kOp, 1, 0);
  ControllerBeat m;
  m.controller = r.address("controller");
  return r.done(std::move(m));
}

actor::SystemHeader HostAttached::encode() const {
  return {kOp, {refusal, hostname}, {host_mesh, host_index, worker_pid}};
}
Result<HostAttached> HostAttached::decode(const actor::SystemHeader& h) {
  Reader r(h, kOp, 2, 3);
  HostAttached m;
  m.refusal = r.text();
  m.hostname = r.text();
  m.host_mesh = r.number();
  m.host_index = r.number();
  m.worker_pid = r.number();
  return r.done(std::move(m));
}

actor::SystemHeader HostSpawned::encode() const {
  actor::SystemHeader h{kOp, {error}, {request}};
  for (const auto& p : procs) {
    h.args.push_back(p.key);
    h.numbers.push_back(u(p.pid));
  }
  return h;
}
Result<HostSpawned> HostSpawned::decode(const actor::SystemHeader& h) {
  Reader r(h, kOp, 1, 1, Reader::AtLeast{});
  HostSpawned m;
  m.error = r.text();
  m.request = r.number();
  if (r.ok() && r.texts_left() != r.numbers_left()) {
    r.fail(std::to_string(r.texts_left()) + " proc addresses but " +
           std::to_string(r.numbers_left()) + " pids");
  }
  if (r.ok() && !m.error.empty() && r.texts_left() != 0) r.fail("an error with procs");
  while (r.ok() && r.texts_left() > 0) {
    HostSpawned::Proc p;
    p.key = r.text();
    p.pid = static_cast<int64_t>(r.number());
    if (!channel::Address::parse(p.key)) r.fail("proc address '" + p.key + "' does not parse");
    m.procs.push_back(std::move(p));
  }
  return r.done(std::move(m));
}

actor::SystemHeader HostFound::encode() const {
  actor::SystemHeader h{kOp, {error}, {request}};
  if (!error.empty()) return h;
  h.args.push_back(extent);
  h.numbers.push_back(first);
  for (const auto& p : procs) {
    h.args.push_back(p.key);
    h.args.push_back(p.exit);
    h.numbers.push_back(u(p.pid));
  }
  return h;
}
Result<HostFound> HostFound::decode(const actor::SystemHeader& h) {
  Reader r(h, kOp, 1, 1, Reader::AtLeast{});
  HostFound m;
  m.error = r.text();
  m.request = r.number();
  if (!r.ok() || !m.error.empty()) {
    if (r.ok() && (r.texts_left() || r.numbers_left())) r.fail("an error with a mesh");
    return r.done(std::move(m));
  }
  if (r.texts_left() < 1 || r.numbers_left() < 1) {
    r.fail("no extent and first rank");
    return r.done(std::move(m));
  }
  m.extent = r.text();
  m.first = r.number();
  if (!ndslice::decode<ndslice::Extent>(m.extent)) r.fail("bad extent");
  if (r.ok() && (r.texts_left() != 2 * r.numbers_left() || r.numbers_left() == 0)) {
    r.fail(std::to_string(r.texts_left()) + " texts for " + std::to_string(r.numbers_left()) +
           " procs (a key and an exit each, at least one)");
  }
  while (r.ok() && r.numbers_left() > 0) {
    HostFound::Proc p;
    p.key = r.text();
    p.exit = r.text();
    p.pid = static_cast<int64_t>(r.number());
    if (!channel::Address::parse(p.key)) r.fail("proc address '" + p.key + "' does not parse");
    m.procs.push_back(std::move(p));
  }
  return r.done(std::move(m));
}

actor::SystemHeader HostProcExit::encode() const {
  return {kOp, {proc_key}, {host_mesh, host_index, u(pid), signaled ? 1u : 0u, u32(code)}};
}
Result<HostProcExit> HostProcExit::decode(const actor::SystemHeader& h) {
  Reader r(h, kOp, 1, 5);
  HostProcExit m;
  m.proc_key = r.text();
  m.host_mesh = r.number();
  m.host_index = r.number();
  m.pid = static_cast<int64_t>(r.number());
  m.signaled = r.flag("signaled");
  m.code = r.i32();
  return r.done(std::move(m));
}

actor::SystemHeader WorkerBeat::encode() const { return {kOp, {}, {host_mesh, host_index}}; }
Result<WorkerBeat> WorkerBeat::decode(const actor::SystemHeader& h) {
  Reader r(h, kOp, 0, 2);
  WorkerBeat m;
  m.host_mesh = r.number();
  m.host_index = r.number();
  return r.done(std::move(m));
}

actor::SystemHeader HostOutput::encode() const {
  return {kOp, {data}, {static_cast<uint64_t>(fd)}};
}
Result<HostOutput> HostOutput::decode(const actor::SystemHeader& h) {
  Reader r(h, kOp, 1, 1);
  HostOutput m;
  m.data = r.text();
  uint64_t fd = r.number();
  if (r.ok() && fd != 1 && fd != 2) r.fail("fd " + std::to_string(fd) + " is not 1 or 2");
  m.fd = static_cast<int>(fd);
  return r.done(std::move(m));
}

actor::SystemHeader Ready::encode() const { return {kOp, {listen}, {proc_mesh, rank, pid}}; }
Result<Ready> Ready::decode(const actor::SystemHeader& h) {
  Reader r(h, kOp, 1, 3);
  Ready m;
  m.listen = r.text();
  m.proc_mesh = r.number();
  m.rank = r.number();
  m.pid = r.number();
  return r.done(std::move(m));
}

actor::SystemHeader ProcExit::encode() const {
  return {kOp, {proc_key, cause}, {u(pid), expected ? 1u : 0u, u32(signal), u32(code)}};
}
Result<ProcExit> ProcExit::decode(const actor::SystemHeader& h) {
  Reader r(h, kOp, 2, 4);
  ProcExit m;
  m.proc_key = r.text();
  m.cause = r.text();
  m.pid = static_cast<int64_t>(r.number());
  m.expected = r.flag("expected");
  m.signal = r.i32();
  m.code = r.i32();
  return r.done(std::move(m));
}

actor::SystemHeader KillRequest::encode() const { return {kOp, {proc_key}, {}}; }
Result<KillRequest> KillRequest::decode(const actor::SystemHeader& h) {
  Reader r(h, kOp, 1, 0);
  KillRequest m;
  m.proc_key = r.text();
  return r.done(std::move(m));
}

actor::SystemHeader AdoptProcs::encode() const { return {kOp, {controller.to_string()}, {}}; }
Result<AdoptProcs> AdoptProcs::decode(const actor::SystemHeader& h) {
  Reader r(h, kOp, 1, 0);
  AdoptProcs m;
  m.controller = r.address("controller");
  return r.done(std::move(m));
}

}  // namespace podium::mesh::proto
