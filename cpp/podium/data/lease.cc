// podium::data::LeaseCache (lease.h).
#include "podium/data/lease.h"

#include <algorithm>
#include <cstdlib>

#include "podium/base/env.h"

namespace podium::data {

LeaseConfig LeaseConfig::from_env() {
  LeaseConfig c;
  if (auto ms = env_number("PODIUM_RDMA_LEASE_MS")) c.lease = std::chrono::milliseconds(*ms);
  if (auto b = env_number("PODIUM_RDMA_LEASE_MAX_BYTES")) c.max_bytes = *b;
  return c;
}

std::string LeaseCache::buffer_key(std::string_view owner, uint64_t id) {
  std::string k(owner);
  k += '\x1f';
  k += std::to_string(id);
  return k;
}

std::string LeaseCache::key(std::string_view owner, uint64_t id, bool write) {
  return buffer_key(owner, id) + (write ? 'w' : 'r');
}

void LeaseCache::sweep(LeaseClock::time_point now) {
  for (auto it = leases_.begin(); it != leases_.end();) {
    it = it->second.deadline <= now ? leases_.erase(it) : std::next(it);
  }
  for (auto it = revoked_.begin(); it != revoked_.end();) {
    it = it->second <= now ? revoked_.erase(it) : std::next(it);
  }
}

void LeaseCache::maybe_sweep(LeaseClock::time_point now) {
  // Amortized: after a sweep that left many (unexpired) entries, the next waits until their
  // number has doubled, so that a burst of drops does not make every grant a full scan.
  if (leases_.size() + revoked_.size() < sweep_at_) return;
  sweep(now);
  sweep_at_ = std::max(kSweepAt, 2 * (leases_.size() + revoked_.size()));
}

bool LeaseCache::revoked_locked(const std::string& bkey, LeaseClock::time_point now) {
  auto it = revoked_.find(bkey);
  if (it == revoked_.end()) return false;
  if (it->second > now) return true;
  revoked_.erase(it);
  return false;
}

void LeaseCache::grant(std::string_view owner, uint64_t id, bool write, std::string_view token,
                       LeaseClock::time_point sent, LeaseClock::duration granted) {
  std::lock_guard lock(mu_);
  if (granted <= LeaseClock::duration::zero()) {
    leases_.erase(key(owner, id, write));
    return;
  }
  auto now = LeaseClock::now();
  maybe_sweep(now);
  if (revoked_locked(buffer_key(owner, id), now)) return;  // DA-42: answered before the drop
  leases_[key(owner, id, write)] = Lease{std::string(token), sent + granted, granted};  // DA-26
}

std::optional<LeaseClock::duration> LeaseCache::usable_locked(std::string_view owner,
                                                              uint64_t id, bool write,
                                                              std::string_view token,
                                                              LeaseClock::time_point now) const {
  auto it = leases_.find(key(owner, id, write));
  if (it == leases_.end() || it->second.token != token) return std::nullopt;
  auto left = it->second.deadline - now;
  if (left < it->second.granted / 2) return std::nullopt;  // DA-26: at least half left
  return left;
}

std::optional<LeaseClock::duration> LeaseCache::usable(std::string_view owner, uint64_t id,
                                                       bool write, std::string_view token,
                                                       LeaseClock::time_point now) const {
  std::lock_guard lock(mu_);
  return usable_locked(owner, id, write, token, now);
}

LeaseClock::duration LeaseCache::left(std::string_view owner, uint64_t id, bool write,
                                      LeaseClock::time_point now) const {
  std::lock_guard lock(mu_);
  auto it = leases_.find(key(owner, id, write));
  if (it == leases_.end() || it->second.deadline <= now) return LeaseClock::duration::zero();
  return it->second.deadline - now;
}

void LeaseCache::forget(std::string_view owner, uint64_t id, bool write) {
  std::lock_guard lock(mu_);
  leases_.erase(key(owner, id, write));
}

size_t LeaseCache::size() const {
  std::lock_guard lock(mu_);
  return leases_.size();
}

std::optional<LeaseClock::duration> LeaseCache::hold(std::string_view owner, uint64_t id,
                                                     bool write, std::string_view token,
                                                     LeaseClock::time_point now) {
  std::lock_guard lock(mu_);
  auto left = usable_locked(owner, id, write, token, now);
  if (left) ++held_[buffer_key(owner, id)].holds;  // DA-42
  return left;
}

bool LeaseCache::hold_granted(std::string_view owner, uint64_t id, LeaseClock::time_point now) {
  std::lock_guard lock(mu_);
  auto bkey = buffer_key(owner, id);
  if (revoked_locked(bkey, now)) return false;
  ++held_[bkey].holds;
  return true;
}

void LeaseCache::release(std::string_view owner, uint64_t id) {
  std::vector<std::function<void()>> run;
  {
    std::lock_guard lock(mu_);
    auto it = held_.find(buffer_key(owner, id));
    if (it == held_.end() || it->second.holds == 0) return;
    if (--it->second.holds > 0) return;
    run = std::move(it->second.waiting);
    held_.erase(it);
  }
  for (auto& f : run) f();
}

void LeaseCache::revoke(std::string_view owner, uint64_t id, LeaseClock::time_point now,
                        std::function<void()> done) {
  {
    std::lock_guard lock(mu_);
    leases_.erase(key(owner, id, false));
    leases_.erase(key(owner, id, true));
    maybe_sweep(now);
    auto bkey = buffer_key(owner, id);
    revoked_[bkey] = now + kRevokedKept;
    auto it = held_.find(bkey);
    if (it != held_.end() && it->second.holds > 0) {
      it->second.waiting.push_back(std::move(done));
      return;
    }
  }
  done();
}

size_t LeaseCache::revocations_kept() const {
  std::lock_guard lock(mu_);
  return revoked_.size();
}

size_t LeaseCache::holds(std::string_view owner, uint64_t id) const {
  std::lock_guard lock(mu_);
  auto it = held_.find(buffer_key(owner, id));
  return it == held_.end() ? 0 : it->second.holds;
}

}  // namespace podium::data
