#include "proto/protobuf_log.h"

#include <google/protobuf/stubs/logging.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>

#include "common/logging.h"

namespace mc {
namespace {

namespace pb = google::protobuf;

std::atomic<uint64_t> messages{0};
std::atomic<uint64_t> logged{0};

void Handle(pb::LogLevel level, const char* filename, int line, const std::string& message) {
  if (level == pb::LOGLEVEL_FATAL) {
    Logger("protobuf").error("{}:{}: {}", filename, line, message);
    return;
  }
  messages.fetch_add(1, std::memory_order_relaxed);
  static RateLimiter limiter(std::chrono::seconds(10));
  uint64_t suppressed = 0;
  if (!limiter.Allow(&suppressed)) return;
  logged.fetch_add(1, std::memory_order_relaxed);
  internal::LogWithSuppressed(
      Logger("protobuf"), level == pb::LOGLEVEL_INFO ? spdlog::level::info : spdlog::level::warn,
      suppressed, std::string(filename) + ":" + std::to_string(line) + ": " + message);
}

}  // namespace

void RouteProtobufLogs() {
  static std::once_flag once;
  std::call_once(once, [] { pb::SetLogHandler(&Handle); });
}

ProtobufLogStats ProtobufLogStatsNow() {
  return {.messages = messages.load(std::memory_order_relaxed),
          .logged = logged.load(std::memory_order_relaxed)};
}

}  // namespace mc
