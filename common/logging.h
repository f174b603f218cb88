// Module loggers over spdlog. Each module asks for its own named logger once
// (`static auto& log = mc::Logger("master");`); levels are set globally by the daemons' --log_level.
// Request-scoped lines carry the key or request id; ERROR means an operator must act.
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "spdlog/spdlog.h"

namespace mc {

// The logger of one module, created on first use with the global level and pattern.
spdlog::logger& Logger(std::string_view module);

// "trace", "debug", "info", "warn", "error", "off". False on an unknown name.
bool SetLogLevel(std::string_view level);

// Lets at most one event through per `interval` (for hot paths); counts what it suppressed.
class RateLimiter {
 public:
  explicit RateLimiter(std::chrono::milliseconds interval) : interval_ms_(interval.count()) {}
  // True when the caller may log now; `suppressed` receives how many were dropped since.
  bool Allow(uint64_t* suppressed);

 private:
  const int64_t interval_ms_;
  std::atomic<int64_t> next_ms_{0};
  std::atomic<uint64_t> suppressed_{0};
};

// Printable form of an opaque binary key: printable ASCII as is, otherwise hex; long keys cut.
std::string KeyForLog(std::string_view key);

}  // namespace mc
