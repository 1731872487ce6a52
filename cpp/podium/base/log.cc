#include "podium/base/log.h"

#include <spdlog/sinks/stdout_sinks.h>

namespace podium::base {
namespace {

// spdlog's registry (the default logger, its sink and pattern formatter) is a function-local
// static that the first thread to log builds, inside Debian's libspdlog.so, which sanitizers
// do not instrument. Built lazily by an io thread while another logs, TSan cannot see the
// static's guard and reports the formatter's first use as a race. Built here, during static
// initialisation, it exists before any thread of the process does.
[[maybe_unused]] const bool g_registry_built = (spdlog::default_logger_raw(), true);

}  // namespace

void init_logging() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto previous = spdlog::default_logger();
    auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    auto logger = std::make_shared<spdlog::logger>("", std::move(sink));
    logger->set_level(previous->level());
    logger->flush_on(previous->flush_level());
    spdlog::set_default_logger(std::move(logger));
  });
}

bool RateLimitedLog::allow(uint64_t& suppressed, Clock::time_point now) {
  std::lock_guard lock(mu_);
  if (now - window_start_ >= interval_) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= burst_) {
    ++held_;
    ++total_;
    return false;
  }
  ++in_window_;
  suppressed = std::exchange(held_, 0);
  return true;
}

uint64_t RateLimitedLog::total_suppressed() const {
  std::lock_guard lock(mu_);
  return total_;
}

}  // namespace podium::base
