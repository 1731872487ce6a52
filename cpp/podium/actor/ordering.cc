#include "podium/actor/ordering.h"

#include <spdlog/spdlog.h>

#include <unordered_set>

#include "podium/actor/message.h"
#include "podium/base/clock_timer.h"

namespace podium::actor {

std::string_view proc_of(std::string_view text) {
  // An actor's text ends with "[index]" (ids.h), optionally ":port"; a proc's is an address.
  auto hash = text.rfind('#');
  if (hash == std::string_view::npos) return text;
  auto rest = text.substr(hash + 1);
  if (auto colon = rest.rfind(':'); colon != std::string_view::npos) rest = rest.substr(0, colon);
  return !rest.empty() && rest.back() == ']' ? text.substr(0, hash) : text;
}

// ---- SeqCounters ----

void SeqCounters::next_seqs(uint64_t stream, std::span<const std::string* const> dests,
                            std::string_view one, uint64_t* out) {
  std::lock_guard lock(mu_);
  auto& per_dest = out_[stream];
  auto bump = [&](std::string_view d) {
    auto it = per_dest.find(d);
    if (it == per_dest.end()) {
      auto block = std::make_shared<uint64_t[]>(1);  // zeroed
      it = per_dest.emplace(std::string(d), Counter{block.get(), block}).first;
    }
    return ++*it->second.value;
  };
  if (dests.empty()) {
    *out = bump(one);
    return;
  }
  for (size_t i = 0; i < dests.size(); ++i) out[i] = bump(*dests[i]);
}

void SeqCounters::next_seqs(std::span<uint64_t* const> slots, uint64_t* out) {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < slots.size(); ++i) out[i] = ++*slots[i];
}

SeqSlots SeqCounters::seq_slots(uint64_t stream, std::span<const std::string* const> dests) {
  SeqSlots out;
  out.slots.reserve(dests.size());
  std::lock_guard lock(mu_);
  auto& per_dest = out_[stream];
  size_t missing = 0;
  for (const std::string* d : dests) missing += per_dest.contains(*d) ? 0 : 1;
  auto block = missing ? std::make_shared<uint64_t[]>(missing) : nullptr;
  uint64_t* next = block.get();
  for (const std::string* d : dests) {
    auto it = per_dest.find(*d);
    if (it == per_dest.end()) {  // a dest listed twice gets one counter
      it = per_dest.emplace(*d, Counter{next++, block}).first;
    }
    out.slots.push_back(it->second.value);
    if (out.blocks.empty() || out.blocks.back() != it->second.block) {
      out.blocks.push_back(it->second.block);
    }
  }
  return out;
}

void SeqCounters::forget_dests(std::span<const std::string> proc_keys) {
  if (proc_keys.empty()) return;
  std::unordered_set<std::string_view> gone(proc_keys.begin(), proc_keys.end());
  std::lock_guard lock(mu_);
  for (auto it = out_.begin(); it != out_.end();) {
    std::erase_if(it->second, [&](const auto& kv) { return gone.contains(proc_of(kv.first)); });
    it = it->second.empty() ? out_.erase(it) : std::next(it);
  }
}

void SeqCounters::forget_stream(uint64_t stream) {
  std::lock_guard lock(mu_);
  out_.erase(stream);
}

size_t SeqCounters::stream_count() const {
  std::lock_guard lock(mu_);
  return out_.size();
}

// ---- OrderedInbox ----

OrderedInbox::OrderedInbox(asio::io_context& io, std::shared_ptr<base::Clock> clock,
                           std::chrono::nanoseconds gap_timeout, Deliver deliver)
    : io_(io), clock_(std::move(clock)), gap_timeout_(gap_timeout), deliver_(std::move(deliver)) {}

OrderedInbox::~OrderedInbox() = default;

void OrderedInbox::route(wire::Envelope&& env) {
  // Keyed as the sender numbers them: per destination text, so that an actor reached under
  // two spellings of this proc's address (an alias) gets two streams rather than one whose
  // second numbering looks like duplicates of the first.
  std::string key = std::to_string(env.order_stream);
  key += ' ';
  key += env.dest;
  std::unique_lock lock(mu_);
  Stream& s = streams_[key];
  if (s.sender_proc.empty() && !env.sender.empty()) s.sender_proc = proc_of(env.sender);
  uint64_t seq = env.order_seq;
  if (seq < s.next) {
    spdlog::debug("podium: dropping duplicate call {} of stream {} to {}", seq, env.order_stream,
                  env.dest);
    return;
  }
  if (seq > s.next) {
    s.early.emplace(seq, std::move(env));
    if (!s.gap_timer) arm_gap_timer(key, s);
    return;
  }
  s.ready.push_back(std::move(env));
  ++s.next;
  release_early(s);
  // The gap closed: its timer would only wake a thread for nothing.
  if (s.early.empty() && s.gap_timer) s.gap_timer.reset();
  deliver_ready(lock, s);
}

void OrderedInbox::release_early(Stream& s) {
  while (!s.early.empty() && s.early.begin()->first == s.next) {
    s.ready.push_back(std::move(s.early.begin()->second));
    s.early.erase(s.early.begin());
    ++s.next;
  }
}

void OrderedInbox::deliver_ready(std::unique_lock<std::mutex>& lock, Stream& s) {
  if (s.delivering) return;
  s.delivering = true;
  while (!s.ready.empty()) {
    wire::Envelope next = std::move(s.ready.front());
    s.ready.pop_front();
    lock.unlock();
    deliver_(std::move(next));
    lock.lock();
  }
  s.delivering = false;
}

void OrderedInbox::arm_gap_timer(const std::string& key, Stream& s) {
  s.gap_at = s.next;
  s.gap_timer = std::make_unique<base::Timer>(io_, clock_);
  s.gap_timer->expires_after(std::chrono::duration_cast<base::Clock::duration>(gap_timeout_));
  std::weak_ptr<int> alive = life_;
  s.gap_timer->async_wait([this, key, alive](const std::error_code& ec) {
    if (ec) return;
    auto held = alive.lock();
    if (!held) return;
    on_gap_timeout(key);
  });
}

void OrderedInbox::on_gap_timeout(const std::string& key) {
  std::unique_lock lock(mu_);
  auto it = streams_.find(key);
  if (it == streams_.end()) return;
  Stream& s = it->second;
  s.gap_timer.reset();
  if (s.early.empty()) return;
  if (s.next == s.gap_at) {
    uint64_t first = s.early.begin()->first;
    spdlog::warn("podium: calls {}..{} of stream {} never arrived within {} ms; delivering the "
                 "{} that followed",
                 s.next, first - 1, key,
                 std::chrono::duration_cast<std::chrono::milliseconds>(gap_timeout_).count(),
                 s.early.size());
    s.next = first;
    release_early(s);
    deliver_ready(lock, s);
    if (s.early.empty()) return;
  }
  if (!s.gap_timer) arm_gap_timer(key, s);
}

void OrderedInbox::forget_senders(std::span<const std::string> proc_keys) {
  if (proc_keys.empty()) return;
  std::unordered_set<std::string_view> gone(proc_keys.begin(), proc_keys.end());
  std::vector<std::unique_ptr<base::Timer>> timers;  // cancelled outside the lock
  std::vector<wire::Envelope> held;  // calls that waited for a gap its sender will never fill
  {
    std::lock_guard lock(mu_);
    for (auto it = streams_.begin(); it != streams_.end();) {
      Stream& s = it->second;
      if (s.sender_proc.empty() || s.delivering || !gone.contains(s.sender_proc)) {
        ++it;
        continue;
      }
      for (auto& [seq, env] : s.early) held.push_back(std::move(env));
      if (s.gap_timer) timers.push_back(std::move(s.gap_timer));
      it = streams_.erase(it);
    }
  }
  // Nothing is dropped (AC-8): what was held goes on, in order, gaps skipped.
  for (auto& env : held) deliver_(std::move(env));
}

size_t OrderedInbox::stream_count() const {
  std::lock_guard lock(mu_);
  return streams_.size();
}

size_t OrderedInbox::held_count() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [key, s] : streams_) n += s.early.size() + s.ready.size();
  return n;
}

}  // namespace podium::actor
