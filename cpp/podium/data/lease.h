// podium::data::LeaseCache — the reader's side of checked leases (docs/data.md, "Leases").
//
// Before a transfer a reader asks each buffer's owner to check its capability token (DA-7),
// one control-plane round trip. A successful check may grant a lease: for `granted` after the
// owner checked, the owner keeps the buffer's memory registered whatever happens (DA-27), so
// the reader may transfer again without asking. The reader keeps its leases here.
//
// Threads: every member is thread-safe. Locks: `mu_` is a leaf.
// Invariants:
//   DA-26 A lease is keyed by (owner proc, buffer id, kind: read or write) and holds the token
//         it was granted for. Its deadline is the reader's own steady-clock time when it SENT
//         the check plus the granted time, never the owner's clock: the owner starts counting
//         only once it grants, later, so the reader's deadline falls first without
//         synchronized clocks (clock rates are assumed equal over a lease, a few hundred ms).
//         usable() answers only for the same token and kind, and only while at least half
//         of the granted time is left; forget() drops a lease (a leased transfer failed).
//   DA-42 Revocation (an owner's drop or stop asks it): revoke() forgets both leases of
//         (owner, id) and refuses later grants and holds of it; its `done` runs once no
//         transfer holds (owner, id) any more. A transfer holds a buffer from the moment it may use a lease
//         (hold(), or hold_granted() right after its check granted one) until the engine is
//         done with it (release()), so once `done` ran no transfer of this process touches
//         that buffer's memory under a lease.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace podium::data {

using LeaseClock = std::chrono::steady_clock;

// How long the leases this process asks for (as a reader) and grants (as an owner) last, and
// the largest transfer that uses them. From PODIUM_RDMA_LEASE_MS (default 250; 0: no leases)
// and PODIUM_RDMA_LEASE_MAX_BYTES (default 4 MiB).
struct LeaseConfig {
  std::chrono::milliseconds lease{250};
  uint64_t max_bytes = uint64_t{4} << 20;
  static LeaseConfig from_env();
};

class LeaseCache {
 public:
  // Records the lease granted for (owner, id, write, token): `granted` from `sent`, the
  // reader's time when it sent the check. A zero grant forgets any lease of that key.
  void grant(std::string_view owner, uint64_t id, bool write, std::string_view token,
             LeaseClock::time_point sent, LeaseClock::duration granted);
  // The time left of a lease of (owner, id, write) for `token` at `now`, when at least half of
  // its grant is left; else nothing (no lease, another token, too little left).
  [[nodiscard]] std::optional<LeaseClock::duration> usable(std::string_view owner, uint64_t id,
                                                           bool write, std::string_view token,
                                                           LeaseClock::time_point now) const;
  // The time left of the lease of (owner, id, write) at `now`; zero when none.
  [[nodiscard]] LeaseClock::duration left(std::string_view owner, uint64_t id, bool write,
                                          LeaseClock::time_point now) const;
  void forget(std::string_view owner, uint64_t id, bool write);
  size_t size() const;

  // DA-42: usable(), and when it answers, a hold on (owner, id) taken under the same lock.
  [[nodiscard]] std::optional<LeaseClock::duration> hold(std::string_view owner, uint64_t id,
                                                         bool write, std::string_view token,
                                                         LeaseClock::time_point now);
  // DA-42: a hold on (owner, id) for a transfer its owner's check just granted a lease to;
  // false when (owner, id) was revoked (the transfer must not run).
  [[nodiscard]] bool hold_granted(std::string_view owner, uint64_t id,
                                  LeaseClock::time_point now);
  // DA-42: ends one hold; the revocations waiting for the last one run (on this thread).
  void release(std::string_view owner, uint64_t id);
  // DA-42: forgets (owner, id)'s leases, refuses its later grants and holds (until `now` +
  // kRevokedKept), and runs `done` once it has no hold: here when it has none now.
  void revoke(std::string_view owner, uint64_t id, LeaseClock::time_point now,
              std::function<void()> done);
  // Holds now on (owner, id), and revocations remembered (tests).
  size_t holds(std::string_view owner, uint64_t id) const;
  size_t revocations_kept() const;

  // How long a revocation refuses grants: a check answered before the drop may reach the
  // reader after its revocation; no lease outlives this (the owner grants at most 30 s).
  static constexpr LeaseClock::duration kRevokedKept = std::chrono::seconds(31);

 private:
  struct Lease {
    std::string token;
    LeaseClock::time_point deadline;
    LeaseClock::duration granted{};
  };
  struct Held {
    size_t holds = 0;
    std::vector<std::function<void()>> waiting;  // revocations waiting for holds == 0
  };
  static std::string key(std::string_view owner, uint64_t id, bool write);
  static std::string buffer_key(std::string_view owner, uint64_t id);
  std::optional<LeaseClock::duration> usable_locked(std::string_view owner, uint64_t id,
                                                    bool write, std::string_view token,
                                                    LeaseClock::time_point now) const;  // mu_
  void sweep(LeaseClock::time_point now);  // under mu_: drops expired leases and revocations
  void maybe_sweep(LeaseClock::time_point now);  // under mu_: sweep(), amortized
  bool revoked_locked(const std::string& bkey, LeaseClock::time_point now);  // under mu_

  mutable std::mutex mu_;
  std::unordered_map<std::string, Lease> leases_;  // guarded by mu_
  std::unordered_map<std::string, Held> held_;     // guarded by mu_; by buffer_key
  std::unordered_map<std::string, LeaseClock::time_point> revoked_;  // guarded by mu_
  static constexpr size_t kSweepAt = 4096;  // entries kept before expired ones are swept
  size_t sweep_at_ = kSweepAt;  // guarded by mu_: the entries at which the next sweep runs
};

}  // namespace podium::data
