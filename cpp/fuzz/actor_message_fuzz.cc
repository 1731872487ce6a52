// Fuzz target: the actor layer's msgpack decoders of peer bytes (actor/message.h,
// actor/mesh_failure.h): call, reply and system headers (the system header carries the mesh
// host protocol: spawn, stop, attach, ... are its ops) and failure reports. Exercises WI-7
// (wire/peer_msgpack.h): a value can announce no more than its bytes hold.
#include "fuzz.h"
#include "podium/actor/mesh_failure.h"
#include "podium/actor/message.h"

using namespace podium;
using namespace podium::actor;

const char* const podium::fuzz::kTargetName = "actor_message";

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Buffer b = Buffer::copy_of(std::span(reinterpret_cast<const std::byte*>(data + 1), size - 1));
  switch (data[0] % 4) {
    case 0:
      if (auto h = decode_call_header(b)) {
        auto again = decode_call_header(encode_call_header(*h));
        PODIUM_FUZZ_CHECK(again && again->endpoint == h->endpoint && again->rank == h->rank &&
                          again->labels == h->labels && again->sizes == h->sizes);
      }
      break;
    case 1:
      (void)decode_reply_header(b);
      break;
    case 2:
      if (auto h = decode_system_header(b)) {
        auto again = decode_system_header(encode_system_header(*h));
        PODIUM_FUZZ_CHECK(again && again->op == h->op && again->args == h->args &&
                          again->numbers == h->numbers);
      }
      break;
    default:
      (void)decode_mesh_failure(b);
  }
  return 0;
}

std::vector<podium::fuzz::Input> podium::fuzz::seeds() {
  std::vector<Input> out;
  auto with = [&](uint8_t which, const Buffer& b) {
    Input in{which};
    auto s = bytes_of(b.span());
    in.insert(in.end(), s.begin(), s.end());
    out.push_back(std::move(in));
  };
  with(0, encode_call_header(CallHeader{"step", 3, {"hosts", "gpus"}, {2, 4}}));
  with(1, encode_reply_header(ReplyHeader{7, true, {}}));
  ReplyHeader bad;
  bad.ok = false;
  bad.error = make_error(BaseErrc::kInvalidArgument, "no such endpoint");
  with(1, encode_reply_header(bad));
  with(2, encode_system_header(SystemHeader{"spawn", {"unix:/run/p.sock", "m1"}, {4, 0}}));
  with(2, encode_system_header(SystemHeader{"attach", {"tcp:10.0.0.1:7000"}, {}}));
  MeshFailure f;
  with(3, encode_mesh_failure(f));
  return out;
}
