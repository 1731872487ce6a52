// podium::data::BufferTable (buffer_table.h).
#include "podium/data/buffer_table.h"

#include <sys/random.h>

#include <algorithm>

#include <cerrno>
#include <vector>

namespace podium::data {

namespace {

bool same_token(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

Result<std::string> random_hex(size_t n) {
  std::vector<unsigned char> raw(n);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::getrandom(raw.data() + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return std::unexpected(errno_error("getrandom", errno));
    }
    got += static_cast<size_t>(r);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (unsigned char c : raw) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

Result<BufferTable::Added> BufferTable::add(std::shared_ptr<Registration> reg, std::string owner,
                                            bool writable) {
  auto token = random_hex(16);  // DA-7
  if (!token) return std::unexpected(token.error());
  std::lock_guard lock(mu_);
  uint64_t id = next_id_++;
  live_[id] = Entry{std::move(reg), *token, std::move(owner), writable};
  return Added{id, std::move(*token)};
}

Status BufferTable::check_locked(uint64_t id, std::string_view token, bool write) const {
  auto it = live_.find(id);
  if (it == live_.end()) {
    auto e = ended_.find(id);
    return std::unexpected(make_error(
        DataErrc::kDropped, e != ended_.end()
                                ? e->second.why
                                : "buffer " + std::to_string(id) +
                                      " is not registered here (dropped, or its owner stopped)"));
  }
  if (!same_token(it->second.token, token)) {
    return std::unexpected(make_error(
        DataErrc::kRefused, "buffer " + std::to_string(id) + " of " + it->second.owner +
                                ": the capability token does not match; access refused"));
  }
  if (write && !it->second.writable) {
    return std::unexpected(make_error(
        DataErrc::kRefused, "buffer " + std::to_string(id) + " of " + it->second.owner +
                                " was made from read-only memory; it cannot be written"));
  }
  return {};
}

Status BufferTable::check(uint64_t id, std::string_view token, bool write) const {
  std::lock_guard lock(mu_);
  return check_locked(id, token, write);
}

Result<std::shared_ptr<Registration>> BufferTable::acquire(uint64_t id, std::string_view token,
                                                           bool write) const {
  std::lock_guard lock(mu_);
  auto st = check_locked(id, token, write);
  if (!st) return std::unexpected(st.error());
  return live_.at(id).reg;
}

Status BufferTable::check(std::span<const Access> accesses, LeaseClock::duration lease,
                          LeaseClock::time_point now, size_t* failed, std::string_view grantee,
                          LeaseClock::duration hold) {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < accesses.size(); ++i) {
    auto st = check_locked(accesses[i].id, accesses[i].token, accesses[i].write);
    if (!st) {
      if (failed != nullptr) *failed = i;
      return st;
    }
  }
  // DA-27: all passed; leases granted under the same lock. DA-42: a known grantee counts as
  // a lessee even with no lease, for `hold` (its checked transfer runs after this answer).
  auto keep = std::max(lease, grantee.empty() ? LeaseClock::duration::zero() : hold);
  if (keep > LeaseClock::duration::zero()) {
    for (const auto& a : accesses) {
      auto& e = live_.at(a.id);
      if (e.leased_until < now + keep) e.leased_until = now + keep;
      if (grantee.empty()) {
        e.anonymous_lease = true;
        continue;
      }
      auto& mine = e.lessees[std::string(grantee)];
      if (mine < now + keep) mine = now + keep;
    }
  }
  return {};
}

void BufferTable::end(uint64_t id, std::string why, LeaseClock::time_point until) {
  ended_[id] = Ended{std::move(why), until};
  ended_order_.push_back(id);
  while (ended_order_.size() > kEndedKept) {
    ended_.erase(ended_order_.front());
    ended_order_.pop_front();
  }
}

Result<BufferTable::Retired> BufferTable::drop(uint64_t id, std::string_view token,
                                               LeaseClock::time_point now) {
  std::lock_guard lock(mu_);
  auto it = live_.find(id);
  if (it == live_.end()) {
    // Dropped already: a second drop changes nothing, and completes no earlier than the
    // first (DA-27).
    auto e = ended_.find(id);
    return Retired{{}, e != ended_.end() ? e->second.until : LeaseClock::time_point{}};
  }
  if (!same_token(it->second.token, token)) {
    return std::unexpected(make_error(
        DataErrc::kRefused, "buffer " + std::to_string(id) + " of " + it->second.owner +
                                ": the capability token does not match; drop refused"));
  }
  Retired out;
  out.regs.push_back(std::move(it->second.reg));
  out.until = it->second.leased_until;
  add_lessees(id, it->second, now, out);
  end(id, "buffer " + std::to_string(id) + " of " + it->second.owner + " was dropped", out.until);
  live_.erase(it);
  return out;  // the caller releases the registration (outside mu_), at out.until (DA-27)
}

void BufferTable::add_lessees(uint64_t id, const Entry& e, LeaseClock::time_point now,
                              Retired& out) {
  if (e.anonymous_lease && e.leased_until > now) {
    out.anonymous = true;
    return;
  }
  Lessees l{id, {}};
  for (const auto& [who, until] : e.lessees) {
    if (until > now) l.procs.push_back(who);
  }
  if (!l.procs.empty()) out.lessees.push_back(std::move(l));
}

void BufferTable::revoked(uint64_t id) {
  std::lock_guard lock(mu_);
  auto e = ended_.find(id);
  if (e != ended_.end()) e->second.until = LeaseClock::time_point{};
}

BufferTable::Retired BufferTable::release_owner(std::string_view owner,
                                                LeaseClock::time_point now) {
  Retired out;
  std::lock_guard lock(mu_);
  for (auto it = live_.begin(); it != live_.end();) {
    if (it->second.owner == owner) {
      out.regs.push_back(std::move(it->second.reg));
      if (out.until < it->second.leased_until) out.until = it->second.leased_until;
      add_lessees(it->first, it->second, now, out);
      end(it->first,
          "buffer " + std::to_string(it->first) + " was released: its owner " +
              std::string(owner) + " stopped",
          it->second.leased_until);
      it = live_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

size_t BufferTable::size() const {
  std::lock_guard lock(mu_);
  return live_.size();
}

}  // namespace podium::data
