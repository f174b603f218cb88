#include "master/generation_counter.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace mc::master {
namespace {

// Generations start at the wall clock (ms << 20), so a restarted master never reuses one.
uint64_t InitialGeneration() {
  auto now = std::chrono::system_clock::now().time_since_epoch();
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(now).count())
         << 20;
}

}  // namespace

GenerationCounter::GenerationCounter() : next_(InitialGeneration()) {}

uint64_t GenerationCounter::Next() {
  uint64_t g = next_.load();
  // Never hands out 0 ("never reserved") nor anything at or past kGenerationLimit, and never
  // wraps: once exhausted, every call answers 0 and the put fails.
  while (g < kGenerationLimit && !next_.compare_exchange_weak(g, g + 1)) {
  }
  return g < kGenerationLimit ? g : 0;
}

void GenerationCounter::RaisePast(uint64_t generation) {
  uint64_t next = next_.load();
  while (generation >= next && !next_.compare_exchange_weak(next, generation + 1)) {
  }
}

absl::Status GenerationCounter::CheckReported(uint64_t generation) const {
  const int64_t wall_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
  const uint64_t ceiling =
      std::max(next_.load(), static_cast<uint64_t>(wall_ms + kGenerationLeadMs) << 20);
  if (generation == 0 || generation >= ceiling || generation >= kGenerationLimit) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("generation ", generation,
                                " was never issued by a master (reported generations must lie "
                                "in 1..",
                                std::min(ceiling, kGenerationLimit) - 1, ")"));
  }
  return absl::OkStatus();
}

}  // namespace mc::master
