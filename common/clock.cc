#include "common/clock.h"

#include <chrono>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace mc {

int64_t RealClock::NowMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void RealClock::SleepForMs(int64_t ms) const {
  if (ms > 0) absl::SleepFor(absl::Milliseconds(ms));
}

bool RealClock::WaitUntil(absl::Mutex& mu, const absl::Condition& cond, int64_t deadline_ms) const {
  // absl's timeouts run on its own clock: wait again until the steady clock reaches the deadline.
  for (;;) {
    if (cond.Eval()) return true;
    const int64_t left = deadline_ms - NowMs();
    if (left <= 0) return false;
    if (mu.AwaitWithTimeout(cond, absl::Milliseconds(left))) return true;
  }
}

RealClock& RealClock::Get() {
  static RealClock clock;
  return clock;
}

}  // namespace mc
