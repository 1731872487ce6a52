// Fuzz target: the run tables a cast carries between procs (mesh/cast_plan.h): PortRuns and
// SeqRuns decode (CP-3: counts must add up), and what decodes re-encodes to the same table.
#include "fuzz.h"
#include "podium/mesh/cast_plan.h"

using namespace podium;
using namespace podium::mesh;

const char* const podium::fuzz::kTargetName = "cast_plan";

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  size_t expect = data[1];
  std::string_view in(reinterpret_cast<const char*>(data + 2), size - 2);
  size_t off = 0;
  if (data[0] & 1) {
    auto r = PortRuns::decode(in, &off, expect);
    if (!r) return 0;
    PODIUM_FUZZ_CHECK(r->size() == expect && off <= in.size());
    for (size_t i = 0; i < r->size(); ++i) (void)r->at(i);
  } else {
    auto r = SeqRuns::decode(in, &off, expect);
    if (!r) return 0;
    PODIUM_FUZZ_CHECK(r->size() == expect && off <= in.size());
    std::string again;
    r->encode(again);
    size_t off2 = 0;
    auto r2 = SeqRuns::decode(again, &off2, expect);
    PODIUM_FUZZ_CHECK(r2 && r2->size() == expect);
    for (size_t i = 0; i < expect; ++i) PODIUM_FUZZ_CHECK(r2->at(i) == r->at(i));
  }
  return 0;
}

std::vector<podium::fuzz::Input> podium::fuzz::seeds() {
  std::vector<Input> out;
  std::vector<std::string> ports;
  for (int i = 0; i < 12; ++i) {
    ports.push_back("unix:/run/m-" + std::to_string(i / 4) + ".sock#p" + std::to_string(100 + i));
  }
  std::string s;
  PortRuns::build(std::span<const std::string>(ports)).encode(s);
  Input a{1, uint8_t(ports.size())};
  a.insert(a.end(), s.begin(), s.end());
  out.push_back(std::move(a));
  std::vector<uint64_t> seqs = {1, 1, 1, 2, 2, 5, 9, 9, 9, 9};
  s.clear();
  SeqRuns::build(seqs).encode(s);
  Input b{0, uint8_t(seqs.size())};
  b.insert(b.end(), s.begin(), s.end());
  out.push_back(std::move(b));
  return out;
}
