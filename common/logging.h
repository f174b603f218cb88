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

#include "common/clock.h"
#include "spdlog/spdlog.h"

namespace mc {

// The logger of one module, created on first use with the global level and pattern.
spdlog::logger& Logger(std::string_view module);

// "trace", "debug", "info", "warn", "error", "off". False on an unknown name.
bool SetLogLevel(std::string_view level);

// Lets at most one event through per `interval` of `clock` (for hot paths); counts what it
// suppressed. `clock` is borrowed.
class RateLimiter {
 public:
  explicit RateLimiter(std::chrono::milliseconds interval, const Clock& clock = RealClock::Get())
      : clock_(clock), interval_ms_(interval.count()) {}
  // True when the caller may log now; `suppressed` receives how many were dropped since.
  bool Allow(uint64_t* suppressed);

 private:
  const Clock& clock_;
  const int64_t interval_ms_;
  std::atomic<int64_t> next_ms_{0};
  std::atomic<uint64_t> suppressed_{0};
};

namespace internal {
// Logs `message` at `level`, noting how many similar messages were dropped before it.
void LogWithSuppressed(spdlog::logger& log, spdlog::level::level_enum level, uint64_t suppressed,
                       const std::string& message);
}  // namespace internal

// Logs at most once per `interval` from this call site, for messages on hot or retrying paths;
// " (N similar messages suppressed)" is appended when some were dropped. `severity` is an spdlog
// level name: MC_LOG_EVERY(std::chrono::seconds(10), Logger("client"), warn, "x failed: {}", s);
#define MC_LOG_EVERY(interval, logger, severity, ...)                                    \
  do {                                                                                    \
    static ::mc::RateLimiter mc_log_every_limiter(interval);                              \
    uint64_t mc_log_every_suppressed = 0;                                                 \
    if (mc_log_every_limiter.Allow(&mc_log_every_suppressed)) {                           \
      ::mc::internal::LogWithSuppressed((logger), ::spdlog::level::severity,              \
                                        mc_log_every_suppressed, fmt::format(__VA_ARGS__)); \
    }                                                                                     \
  } while (0)

// Printable form of an opaque binary key: printable ASCII as is, otherwise hex; long keys cut.
std::string KeyForLog(std::string_view key);

}  // namespace mc
