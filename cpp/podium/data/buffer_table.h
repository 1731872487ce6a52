// podium::data::BufferTable — the buffers this process owns, each with its capability.
//
// An RDMA buffer is a registered region (engine.h) that other processes may read and write
// one-sidedly. Its owner keeps it here under an id, with an unguessable token; a reference
// to the buffer (id, token, address, rkey, worker address) travels to readers over podium's
// authenticated control plane, and a reader asks the owner to check() the token before each
// transfer (docs/data.md, "Capabilities").
//
// Threads: every member is thread-safe. Locks: `mu_` is a leaf; a Registration released by
// drop() or release_owner() is destroyed after it is released (Registration's destructor
// takes the engine's lock).
// Invariants:
//   DA-7 Each buffer carries a 128-bit random token (getrandom); check() and drop() refuse
//        (kRefused) a token that differs, comparing in constant time, and a write to a
//        buffer registered read-only.
//   DA-8 drop() and release_owner() release the buffer's registration at once (the engine's
//        registration_count() falls); later checks of it fail with kDropped and say why (it
//        was dropped, or its owner actor stopped), for the last kEndedKept ended buffers.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "podium/base/error.h"
#include "podium/data/engine.h"

namespace podium::data {

class BufferTable {
 public:
  static constexpr size_t kEndedKept = 4096;

  struct Added {
    uint64_t id = 0;
    std::string token;  // 32 hex digits
  };
  // Keeps `reg` alive until drop() or release_owner(`owner`).
  [[nodiscard]] Result<Added> add(std::shared_ptr<Registration> reg, std::string owner,
                                  bool writable);
  // DA-7: ok when buffer `id` is live, `token` is its token, and a write may write it.
  [[nodiscard]] Status check(uint64_t id, std::string_view token, bool write) const;
  // DA-8.
  [[nodiscard]] Status drop(uint64_t id, std::string_view token);
  size_t release_owner(std::string_view owner);
  size_t size() const;

 private:
  struct Entry {
    std::shared_ptr<Registration> reg;
    std::string token;
    std::string owner;
    bool writable = false;
  };
  void end(uint64_t id, std::string why);  // under mu_

  mutable std::mutex mu_;
  uint64_t next_id_ = 1;                           // guarded by mu_
  std::unordered_map<uint64_t, Entry> live_;       // guarded by mu_
  std::unordered_map<uint64_t, std::string> ended_;  // guarded by mu_: id -> why
  std::deque<uint64_t> ended_order_;               // guarded by mu_
};

// "a3f0...": `n` random bytes from getrandom(2), hex.
[[nodiscard]] Result<std::string> random_hex(size_t n);

}  // namespace podium::data
