// podium::data::BufferTable (buffer_table.h).
#include "podium/data/buffer_table.h"

#include <sys/random.h>

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

Status BufferTable::check(uint64_t id, std::string_view token, bool write) const {
  std::lock_guard lock(mu_);
  auto it = live_.find(id);
  if (it == live_.end()) {
    auto e = ended_.find(id);
    return std::unexpected(make_error(
        DataErrc::kDropped, e != ended_.end()
                                ? e->second
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

void BufferTable::end(uint64_t id, std::string why) {
  ended_[id] = std::move(why);
  ended_order_.push_back(id);
  while (ended_order_.size() > kEndedKept) {
    ended_.erase(ended_order_.front());
    ended_order_.pop_front();
  }
}

Status BufferTable::drop(uint64_t id, std::string_view token) {
  std::shared_ptr<Registration> released;
  {
    std::lock_guard lock(mu_);
    auto it = live_.find(id);
    if (it == live_.end()) return {};  // dropped already: a second drop changes nothing
    if (!same_token(it->second.token, token)) {
      return std::unexpected(make_error(
          DataErrc::kRefused, "buffer " + std::to_string(id) + " of " + it->second.owner +
                                  ": the capability token does not match; drop refused"));
    }
    released = std::move(it->second.reg);
    end(id, "buffer " + std::to_string(id) + " of " + it->second.owner + " was dropped");
    live_.erase(it);
  }
  return {};  // `released` unmaps here, outside mu_
}

size_t BufferTable::release_owner(std::string_view owner) {
  std::vector<std::shared_ptr<Registration>> released;
  std::lock_guard lock(mu_);
  for (auto it = live_.begin(); it != live_.end();) {
    if (it->second.owner == owner) {
      released.push_back(std::move(it->second.reg));
      end(it->first, "buffer " + std::to_string(it->first) + " was released: its owner " +
                         std::string(owner) + " stopped");
      it = live_.erase(it);
    } else {
      ++it;
    }
  }
  return released.size();
}

size_t BufferTable::size() const {
  std::lock_guard lock(mu_);
  return live_.size();
}

}  // namespace podium::data
