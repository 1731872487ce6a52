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
//   DA-8 drop() and release_owner() end the buffer at once: later checks of it fail with
//        kDropped and say why (it was dropped, or its owner actor stopped), for the last
//        kEndedKept ended buffers. They hand its registration back in a Retired, with the
//        time until which it must stay registered (DA-27); dropping the Retired releases it
//        (the engine's registration_count() falls), at once when no lease was granted.
//   DA-27 check() of a batch checks every access and, only when all pass, grants them one
//        lease: it records per buffer the latest expiry granted (its own `now` + `lease`,
//        under the same lock as the check, so no drop slips between). A drop or release
//        returns that expiry as Retired::until: the memory stays registered until then, and
//        a second drop of an ended buffer returns the same time, so no drop completes while
//        a lease that this table granted may still be used. With each grant it records the
//        grantee (the reader's proc) and its expiry, also for a check that grants no lease
//        (its checked transfer runs after the answer); a drop or a release hands back those
//        whose lease is not over, for the owner to revoke (DA-42): revoked() then marks the
//        buffer's leases over, and a later drop of it returns at once.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include <span>
#include <vector>

#include "podium/base/error.h"
#include "podium/data/engine.h"
#include "podium/data/lease.h"

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
  // DA-7, then the buffer's registration (its address and size): for the owner's own TCP
  // bulk server (tcp_bulk.h, DA-45), which serves the bytes itself and so needs no lease.
  [[nodiscard]] Result<std::shared_ptr<Registration>> acquire(uint64_t id, std::string_view token,
                                                              bool write) const;
  struct Access {
    uint64_t id = 0;
    std::string_view token;
    bool write = false;
  };
  // DA-7 for each access; when all pass and `lease` > 0, DA-27: each buffer stays registered
  // until at least `now` + `lease`. On failure, `*failed` is the index of the access refused.
  // `grantee` (the reader's proc, when known) is recorded as a lessee until the later of the
  // lease and `hold`: how long the checked transfer is presumed to run should the grantee
  // not answer a revocation (DA-42), and so how long a drop then waits (DA-27).
  [[nodiscard]] Status check(std::span<const Access> accesses, LeaseClock::duration lease,
                             LeaseClock::time_point now, size_t* failed = nullptr,
                             std::string_view grantee = {},
                             LeaseClock::duration hold = LeaseClock::duration::zero());
  // What a drop or a release ended: registrations to keep until `until` (DA-8, DA-27).
  // `lessees`: per buffer ended, the grantees whose lease of it may not be over (DA-42);
  // none for a buffer leased to a grantee not known, which is waited out.
  struct Lessees {
    uint64_t id = 0;
    std::vector<std::string> procs;
  };
  struct Retired {
    std::vector<std::shared_ptr<Registration>> regs;
    LeaseClock::time_point until{};
    std::vector<Lessees> lessees;
    bool anonymous = false;  // a lease went to a grantee not known: only `until` ends it
  };
  // DA-8. `now`: the drop's time, against which the lessees' leases are read.
  [[nodiscard]] Result<Retired> drop(uint64_t id, std::string_view token,
                                     LeaseClock::time_point now = LeaseClock::now());
  // DA-42: every lessee of ended buffer `id` confirmed its revocation: its leases are over.
  void revoked(uint64_t id);
  [[nodiscard]] Retired release_owner(std::string_view owner,
                                      LeaseClock::time_point now = LeaseClock::now());
  size_t size() const;

 private:
  struct Entry {
    std::shared_ptr<Registration> reg;
    std::string token;
    std::string owner;
    bool writable = false;
    LeaseClock::time_point leased_until{};  // DA-27: the latest lease expiry granted
    // DA-42: each grantee's latest lease expiry (grants without a known grantee count in
    // leased_until only, and so are waited out).
    std::unordered_map<std::string, LeaseClock::time_point> lessees;
    bool anonymous_lease = false;  // a lease was granted to a grantee not known
  };
  struct Ended {
    std::string why;
    LeaseClock::time_point until{};  // DA-27: registered until then
  };
  Status check_locked(uint64_t id, std::string_view token, bool write) const;  // under mu_
  // Adds entry `id`'s unexpired lessees to `out` (DA-42); under mu_.
  static void add_lessees(uint64_t id, const Entry& e, LeaseClock::time_point now,
                          Retired& out);
  void end(uint64_t id, std::string why, LeaseClock::time_point until);        // under mu_

  mutable std::mutex mu_;
  uint64_t next_id_ = 1;                           // guarded by mu_
  std::unordered_map<uint64_t, Entry> live_;       // guarded by mu_
  std::unordered_map<uint64_t, Ended> ended_;       // guarded by mu_
  std::deque<uint64_t> ended_order_;               // guarded by mu_
};

// "a3f0...": `n` random bytes from getrandom(2), hex.
[[nodiscard]] Result<std::string> random_hex(size_t n);

}  // namespace podium::data
