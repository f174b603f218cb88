#include "common/logging.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "absl/strings/escaping.h"
#include "common/status_macros.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace mc {
namespace {

std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}
std::atomic<int>& GlobalLevel() {
  static std::atomic<int> level{spdlog::level::info};
  return level;
}

}  // namespace

spdlog::logger& Logger(std::string_view module) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  std::string name(module);
  if (auto existing = spdlog::get(name)) return *existing;
  auto logger = spdlog::stderr_color_mt(name);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ [%n] %v");
  logger->set_level(static_cast<spdlog::level::level_enum>(GlobalLevel().load()));
  logger->flush_on(spdlog::level::warn);
  return *logger;
}

bool SetLogLevel(std::string_view level) {
  auto parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") return false;
  GlobalLevel().store(parsed);
  std::lock_guard<std::mutex> lock(RegistryMutex());
  spdlog::set_level(parsed);
  return true;
}

bool RateLimiter::Allow(uint64_t* suppressed) {
  const int64_t now = clock_.NowMs();
  int64_t next = next_ms_.load(std::memory_order_relaxed);
  if (now >= next && next_ms_.compare_exchange_strong(next, now + interval_ms_)) {
    if (suppressed != nullptr) *suppressed = suppressed_.exchange(0);
    return true;
  }
  suppressed_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

namespace internal {
void LogWithSuppressed(spdlog::logger& log, spdlog::level::level_enum level, uint64_t suppressed,
                       const std::string& message) {
  if (suppressed == 0) {
    log.log(level, "{}", message);
  } else {
    log.log(level, "{} ({} similar messages suppressed)", message, suppressed);
  }
}
}  // namespace internal

std::string KeyForLog(std::string_view key) {
  constexpr size_t kMaxShown = 64;
  bool printable = true;
  for (unsigned char c : key) {
    if (c < 0x20 || c > 0x7e) {
      printable = false;
      break;
    }
  }
  std::string_view shown = key.substr(0, kMaxShown);
  std::string out =
      printable ? std::string(shown)
                : "0x" + absl::BytesToHexString(absl::string_view(shown.data(), shown.size()));
  if (key.size() > kMaxShown) out += "...(" + std::to_string(key.size()) + "B)";
  return out;
}

namespace internal {
void CheckFailed(const char* cond, const char* file, int line) {
  std::fprintf(stderr, "MC_CHECK failed: %s at %s:%d\n", cond, file, line);
  std::fflush(stderr);
  std::abort();
}
}  // namespace internal

}  // namespace mc
