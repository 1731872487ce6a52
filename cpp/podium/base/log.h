// podium::base logging helpers: where log lines go, and warnings that cannot flood.
//
// Threads: init_logging() and RateLimitedLog::allow() are thread-safe.
//
// Invariants (tests name them):
//   BL-1 After init_logging(), spdlog's default logger writes to stderr: stdout carries only
//        what the program itself prints (a podium process prints the user's output there).
//   BL-2 A RateLimitedLog lets at most `burst` lines through per `interval`; the first line let
//        through after some were held back says how many were (so a flood costs a few lines
//        per interval, and the count is never lost while the condition persists).
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

namespace podium::base {

// Makes spdlog's default logger write to stderr (keeping its level). Idempotent.
void init_logging();

class RateLimitedLog {
 public:
  using Clock = std::chrono::steady_clock;
  explicit RateLimitedLog(Clock::duration interval = std::chrono::seconds(1),
                          uint32_t burst = 10)
      : interval_(interval), burst_(burst) {}

  // True when a line may be logged now; `suppressed` is then the number of calls refused
  // since the last line let through (to be reported with it).
  bool allow(uint64_t& suppressed, Clock::time_point now = Clock::now());
  // Total lines held back so far (tests).
  uint64_t total_suppressed() const;

  // Logs at `level` unless rate-limited; appends " (N similar lines suppressed before this
  // one)" when some were held back since the last line let through.
  template <class... Args>
  void log(spdlog::level::level_enum level, fmt::format_string<Args...> f, Args&&... args) {
    uint64_t suppressed = 0;
    if (!spdlog::default_logger_raw()->should_log(level) || !allow(suppressed)) return;
    std::string line = fmt::format(f, std::forward<Args>(args)...);
    if (suppressed) {
      line += fmt::format(" ({} similar lines suppressed before this one)", suppressed);
    }
    spdlog::log(level, "{}", line);
  }
  template <class... Args>
  void warn(fmt::format_string<Args...> f, Args&&... args) {
    log(spdlog::level::warn, f, std::forward<Args>(args)...);
  }

 private:
  const Clock::duration interval_;
  const uint32_t burst_;
  mutable std::mutex mu_;
  // Guarded by mu_:
  Clock::time_point window_start_{};
  uint32_t in_window_ = 0;
  uint64_t held_ = 0;   // refused since the last line let through
  uint64_t total_ = 0;  // refused ever
};

}  // namespace podium::base
