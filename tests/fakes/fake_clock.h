// A Clock that moves only when a test says so.
#pragma once

#include <atomic>

#include "common/clock.h"

namespace mc {

class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = 1'000'000) : now_ms_(start_ms) {}
  int64_t NowMs() const override { return now_ms_.load(); }
  void AdvanceMs(int64_t ms) { now_ms_.fetch_add(ms); }
  void SetMs(int64_t ms) { now_ms_.store(ms); }

 private:
  std::atomic<int64_t> now_ms_;
};

}  // namespace mc
