#include "podium/mesh/cast_plan.h"

#include <algorithm>
#include <charconv>
#include <msgpack.hpp>

#include "podium/actor/ids.h"
#include "podium/wire/peer_msgpack.h"

namespace podium::mesh {
namespace {

constexpr size_t kMaxDigits = 18;  // fits int64 with room for a step

Error plan_error(std::string msg) {
  return make_error(actor::ActorErrc::kBadArguments, "cast plan: " + std::move(msg));
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// A PortId split into literal pieces around its number tokens (CP-1). The pieces are views
// into the text; texts.size() == numbers.size() + 1.
struct Tokens {
  std::vector<std::string_view> texts;
  std::vector<int64_t> numbers;
};

void tokenize(std::string_view s, Tokens* t) {
  t->texts.clear();
  t->numbers.clear();
  size_t piece = 0, i = 0;
  while (i < s.size()) {
    if (!is_digit(s[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < s.size() && is_digit(s[j])) ++j;
    size_t len = j - i;
    if ((s[i] != '0' || len == 1) && len <= kMaxDigits) {
      int64_t v = 0;
      std::from_chars(s.data() + i, s.data() + j, v);
      t->texts.push_back(s.substr(piece, i - piece));
      t->numbers.push_back(v);
      piece = j;
    }
    i = j;
  }
  t->texts.push_back(s.substr(piece));
}

// start + j * step, wrapping: build() compares and at() computes the same way, so a match
// found through wrap-around still reproduces the number's exact bits (CP-1), and no input
// overflows a signed integer.
int64_t affine(int64_t start, int64_t j, int64_t step) {
  return static_cast<int64_t>(static_cast<uint64_t>(start) +
                              static_cast<uint64_t>(j) * static_cast<uint64_t>(step));
}

struct StringWriter {
  std::string* out;
  void write(const char* p, size_t n) { out->append(p, n); }
};

}  // namespace

// --- PortRuns ------------------------------------------------------------------------------

void PortRuns::push(Run r) {
  size_ += r.count;
  ends_.push_back(size_);
  runs_.push_back(std::move(r));
}

PortRuns PortRuns::build(std::span<const std::string* const> ports) {
  PortRuns out;
  Tokens cur, next;
  Run run;
  auto start = [&](const Tokens& t) {
    run = Run{};
    run.count = 1;
    run.texts.assign(t.texts.begin(), t.texts.end());
    run.starts = t.numbers;
    run.steps.assign(t.numbers.size(), 0);
  };
  for (size_t i = 0; i < ports.size(); ++i) {
    tokenize(*ports[i], &next);
    bool fits = run.count > 0 && next.numbers.size() == run.starts.size() &&
                std::equal(next.texts.begin(), next.texts.end(), run.texts.begin());
    if (fits) {
      const int64_t c = static_cast<int64_t>(run.count);
      for (size_t k = 0; k < next.numbers.size() && fits; ++k) {
        if (run.count == 1) {
          run.steps[k] = affine(next.numbers[k], -1, run.starts[k]);
        } else {
          fits = next.numbers[k] == affine(run.starts[k], c, run.steps[k]);
        }
      }
    }
    if (fits) {
      ++run.count;
      continue;
    }
    if (run.count > 0) out.push(std::move(run));
    start(next);
  }
  if (run.count > 0) out.push(std::move(run));
  return out;
}

PortRuns PortRuns::build(std::span<const std::string> ports) {
  std::vector<const std::string*> p;
  p.reserve(ports.size());
  for (const auto& s : ports) p.push_back(&s);
  return build(std::span<const std::string* const>(p));
}

std::string PortRuns::at(size_t i) const {
  size_t r = std::upper_bound(ends_.begin(), ends_.end(), static_cast<uint64_t>(i)) -
             ends_.begin();
  if (r >= runs_.size()) return {};
  const Run& run = runs_[r];
  int64_t j = static_cast<int64_t>(i - (ends_[r] - run.count));
  std::string s(run.texts[0]);
  for (size_t k = 0; k < run.starts.size(); ++k) {
    s += std::to_string(affine(run.starts[k], j, run.steps[k]));
    s += run.texts[k + 1];
  }
  return s;
}

PortRuns PortRuns::slice(size_t lo, size_t hi) const {
  PortRuns out;
  hi = std::min(hi, size_);
  if (lo >= hi) return out;
  size_t r = std::upper_bound(ends_.begin(), ends_.end(), static_cast<uint64_t>(lo)) -
             ends_.begin();
  for (; r < runs_.size(); ++r) {
    size_t first = ends_[r] - runs_[r].count;
    if (first >= hi) break;
    size_t a = std::max(first, lo), b = std::min<size_t>(ends_[r], hi);
    Run piece = runs_[r];
    int64_t skip = static_cast<int64_t>(a - first);
    for (size_t k = 0; k < piece.starts.size(); ++k) {
      piece.starts[k] = affine(piece.starts[k], skip, piece.steps[k]);
    }
    piece.count = b - a;
    out.push(std::move(piece));
  }
  return out;
}

void PortRuns::encode(std::string& out) const {
  StringWriter w{&out};
  msgpack::packer<StringWriter> pk(w);
  pk.pack_array(static_cast<uint32_t>(runs_.size()));
  for (const Run& r : runs_) {
    pk.pack_array(3);
    pk.pack(r.count);
    pk.pack_array(static_cast<uint32_t>(r.texts.size()));
    for (const auto& t : r.texts) pk.pack(t);
    pk.pack_array(static_cast<uint32_t>(2 * r.starts.size()));
    for (size_t k = 0; k < r.starts.size(); ++k) {
      pk.pack(r.starts[k]);
      pk.pack(r.steps[k]);
    }
  }
}

Result<PortRuns> PortRuns::decode(std::string_view data, size_t* offset, size_t expect) {
  try {
    msgpack::object_handle oh = msgpack::unpack(data.data(), data.size(), *offset, nullptr,
                                                nullptr, wire::peer_unpack_limit(data.size()));
    const msgpack::object& o = oh.get();
    if (o.type != msgpack::type::ARRAY) return std::unexpected(plan_error("ports not an array"));
    PortRuns out;
    for (uint32_t i = 0; i < o.via.array.size; ++i) {
      const auto& e = o.via.array.ptr[i];
      if (e.type != msgpack::type::ARRAY || e.via.array.size != 3) {
        return std::unexpected(plan_error("bad port run"));
      }
      Run r;
      r.count = e.via.array.ptr[0].as<uint64_t>();
      e.via.array.ptr[1].convert(r.texts);
      std::vector<int64_t> nums;
      e.via.array.ptr[2].convert(nums);
      if (r.count == 0 || r.count > expect || r.texts.size() * 2 != nums.size() + 2) {
        return std::unexpected(plan_error("bad port run shape"));
      }
      for (size_t k = 0; k + 1 < nums.size(); k += 2) {
        r.starts.push_back(nums[k]);
        r.steps.push_back(nums[k + 1]);
      }
      if (out.size_ + r.count > expect) break;
      out.push(std::move(r));
    }
    if (out.size_ != expect) {
      return std::unexpected(plan_error("port runs cover " + std::to_string(out.size_) +
                                        " ranks, not " + std::to_string(expect)));
    }
    return out;
  } catch (const std::exception& e) {
    return std::unexpected(plan_error(std::string("malformed port runs: ") + e.what()));
  }
}

// --- SeqRuns -------------------------------------------------------------------------------

void SeqRuns::push(uint64_t count, uint64_t value) {
  if (count == 0) return;
  if (!values_.empty() && values_.back() == value) {
    ends_.back() += count;
  } else {
    values_.push_back(value);
    ends_.push_back(size_ + count);
  }
  size_ += count;
}

SeqRuns SeqRuns::build(std::span<const uint64_t> seqs) {
  SeqRuns out;
  for (size_t i = 0; i < seqs.size();) {
    size_t j = i + 1;
    while (j < seqs.size() && seqs[j] == seqs[i]) ++j;
    out.push(j - i, seqs[i]);
    i = j;
  }
  return out;
}

uint64_t SeqRuns::at(size_t i) const {
  size_t r = std::upper_bound(ends_.begin(), ends_.end(), static_cast<uint64_t>(i)) -
             ends_.begin();
  return r < values_.size() ? values_[r] : 0;
}

SeqRuns SeqRuns::slice(size_t lo, size_t hi) const {
  SeqRuns out;
  hi = std::min(hi, size_);
  if (lo >= hi) return out;
  size_t r = std::upper_bound(ends_.begin(), ends_.end(), static_cast<uint64_t>(lo)) -
             ends_.begin();
  uint64_t first = r == 0 ? 0 : ends_[r - 1];
  for (; r < values_.size() && first < hi; first = ends_[r], ++r) {
    size_t a = std::max<size_t>(first, lo), b = std::min<size_t>(ends_[r], hi);
    out.push(b - a, values_[r]);
  }
  return out;
}

void SeqRuns::encode(std::string& out) const {
  StringWriter w{&out};
  msgpack::packer<StringWriter> pk(w);
  pk.pack_array(static_cast<uint32_t>(2 * values_.size()));
  uint64_t prev = 0;
  for (size_t r = 0; r < values_.size(); ++r) {
    pk.pack(ends_[r] - prev);
    pk.pack(values_[r]);
    prev = ends_[r];
  }
}

Result<SeqRuns> SeqRuns::decode(std::string_view data, size_t* offset, size_t expect) {
  try {
    msgpack::object_handle oh = msgpack::unpack(data.data(), data.size(), *offset, nullptr,
                                                nullptr, wire::peer_unpack_limit(data.size()));
    const msgpack::object& o = oh.get();
    if (o.type != msgpack::type::ARRAY || o.via.array.size % 2 != 0) {
      return std::unexpected(plan_error("seqs not an even array"));
    }
    SeqRuns out;
    for (uint32_t i = 0; i < o.via.array.size; i += 2) {
      uint64_t count = o.via.array.ptr[i].as<uint64_t>();
      if (count == 0 || count > expect - out.size_) {
        return std::unexpected(plan_error("bad seq run"));
      }
      out.push(count, o.via.array.ptr[i + 1].as<uint64_t>());
    }
    if (out.size_ != expect) return std::unexpected(plan_error("seq runs do not cover the chunk"));
    return out;
  } catch (const std::exception& e) {
    return std::unexpected(plan_error(std::string("malformed seq runs: ") + e.what()));
  }
}

}  // namespace podium::mesh
