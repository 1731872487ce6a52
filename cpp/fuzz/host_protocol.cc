// Fuzz target: the mesh host protocol's decoders (mesh/host_protocol.h), one per message. The
// input is a system header of one of the protocol's ops, its fields chosen by the fuzzer, so
// that every decoder sees well-shaped headers with hostile contents (addresses, extents,
// counts, flags) as often as malformed shapes. HP-1 is checked both ways: a message that
// decodes re-encodes and decodes to itself, and one that does not fails with kProtocol and a
// reason naming its op.
//
// Input: [message index] [texts count] [numbers count] numbers (8 bytes each, little-endian)
// then texts (a length byte, then that many bytes). Short inputs are read as far as they go.
#include <string>

#include "fuzz.h"
#include "podium/mesh/errc.h"
#include "podium/mesh/host_protocol.h"
#include "podium/ndslice/codec.h"

using namespace podium;
using namespace podium::mesh;
using namespace podium::mesh::proto;

const char* const podium::fuzz::kTargetName = "host_protocol";

namespace {

template <class T>
void check(const actor::SystemHeader& h) {
  auto m = T::decode(h);
  if (!m) {
    PODIUM_FUZZ_CHECK(m.error().is(MeshErrc::kProtocol));
    PODIUM_FUZZ_CHECK(m.error().message.find(T::kOp) != std::string::npos);
    return;
  }
  auto again = T::decode(m->encode());
  PODIUM_FUZZ_CHECK(again.has_value());
  PODIUM_FUZZ_CHECK(*again == *m);
}

// One entry per message: its op and its check.
struct Kind {
  const char* op;
  void (*run)(const actor::SystemHeader&);
};
constexpr Kind kKinds[] = {
    {HostAttach::kOp, check<HostAttach>},     {HostSpawn::kOp, check<HostSpawn>},
    {HostKill::kOp, check<HostKill>},         {HostDetach::kOp, check<HostDetach>},
    {HostLookup::kOp, check<HostLookup>},     {ControllerBeat::kOp, check<ControllerBeat>},
    {HostAttached::kOp, check<HostAttached>}, {HostSpawned::kOp, check<HostSpawned>},
    {HostFound::kOp, check<HostFound>},       {HostProcExit::kOp, check<HostProcExit>},
    {WorkerBeat::kOp, check<WorkerBeat>},     {HostOutput::kOp, check<HostOutput>},
    {Ready::kOp, check<Ready>},               {ProcExit::kOp, check<ProcExit>},
    {KillRequest::kOp, check<KillRequest>},   {AdoptProcs::kOp, check<AdoptProcs>},
};
constexpr size_t kKindCount = sizeof kKinds / sizeof kKinds[0];

// The input format above, from a header (for the seeds).
podium::fuzz::Input to_input(size_t kind, const actor::SystemHeader& h) {
  podium::fuzz::Input out{uint8_t(kind), uint8_t(h.args.size()), uint8_t(h.numbers.size())};
  for (uint64_t n : h.numbers) {
    for (int i = 0; i < 8; ++i) out.push_back(uint8_t(n >> (8 * i)));
  }
  for (const auto& t : h.args) {
    out.push_back(uint8_t(std::min<size_t>(t.size(), 255)));
    out.insert(out.end(), t.begin(), t.begin() + std::min<size_t>(t.size(), 255));
  }
  return out;
}

template <class T>
size_t index_of() {
  for (size_t i = 0; i < kKindCount; ++i) {
    if (kKinds[i].run == &check<T>) return i;
  }
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const Kind& kind = kKinds[data[0] % kKindCount];
  size_t texts = data[1] % 8, numbers = data[2] % 12;
  size_t at = 3;
  actor::SystemHeader h;
  h.op = kind.op;
  for (size_t i = 0; i < numbers; ++i) {
    uint64_t n = 0;
    for (int b = 0; b < 8 && at < size; ++b) n |= uint64_t(data[at++]) << (8 * b);
    h.numbers.push_back(n);
  }
  for (size_t i = 0; i < texts; ++i) {
    size_t len = at < size ? data[at++] : 0;
    len = std::min(len, size - at);
    h.args.emplace_back(reinterpret_cast<const char*>(data + at), len);
    at += len;
  }
  kind.run(h);
  return 0;
}

std::vector<podium::fuzz::Input> podium::fuzz::seeds() {
  auto ctl = *channel::Address::parse("tcp:10.0.0.1:7000");
  auto extent = *ndslice::Extent::make({"hosts", "gpus"}, {2, 4});
  std::vector<Input> out;
  auto add = [&](size_t kind, const actor::SystemHeader& h) { out.push_back(to_input(kind, h)); };
  add(index_of<HostAttach>(), HostAttach{ctl, "10.0.0.2", 3, 1, 3000}.encode());
  add(index_of<HostSpawn>(), HostSpawn{ctl, "trainers", extent, 9, 4, 4, 4}.encode());
  add(index_of<HostKill>(), HostKill{"tcp:10.0.0.2:4000", 9}.encode());
  add(index_of<HostDetach>(), HostDetach{ctl, 5, true}.encode());
  add(index_of<HostLookup>(), HostLookup{ctl, "trainers", 6}.encode());
  add(index_of<ControllerBeat>(), ControllerBeat{ctl}.encode());
  add(index_of<HostAttached>(), HostAttached{"", "vm2", 3, 1, 4242}.encode());
  add(index_of<HostSpawned>(),
      HostSpawned{9, "", {{"tcp:10.0.0.2:4000", 11}, {"tcp:10.0.0.2:4001", 12}}}.encode());
  add(index_of<HostFound>(),
      HostFound{6, "", ndslice::encode(extent), 4,
                {{"tcp:10.0.0.2:4000", "", 11}, {"tcp:10.0.0.2:4001", "exited with status 3", 12}}}
          .encode());
  add(index_of<HostProcExit>(), HostProcExit{"tcp:10.0.0.2:4000", 3, 1, 11, true, 9}.encode());
  add(index_of<WorkerBeat>(), WorkerBeat{3, 1}.encode());
  add(index_of<HostOutput>(), HostOutput{"line\n", 2}.encode());
  add(index_of<Ready>(), Ready{"unix:/tmp/p.sock", 1, 2, 99}.encode());
  add(index_of<ProcExit>(),
      ProcExit{"unix:/tmp/p.sock", "its proc (pid 3) exited with status 1", 3, true, 0, 1}.encode());
  add(index_of<KillRequest>(), KillRequest{"unix:/tmp/p.sock"}.encode());
  add(index_of<AdoptProcs>(), AdoptProcs{ctl}.encode());
  return out;
}
