// Time as a seam. Components that expire things (leases, puts, clients) or wait (retry pauses,
// periodic loops: common/periodic_thread.h) take a Clock&, so tests inject
// tests/fakes/fake_clock.h instead of sleeping. NowMs() is monotonic milliseconds; SleepForMs
// and WaitUntil wait on this clock's time. Thread-safe.
#pragma once

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace mc {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowMs() const = 0;
  // Returns once `ms` of this clock's time have passed (at once for ms <= 0). Call it with no
  // lock held.
  virtual void SleepForMs(int64_t ms) const = 0;
  // Called with `mu` held: waits until `cond` holds or this clock reads `deadline_ms` or later,
  // and returns with `mu` held; true when `cond` holds. As with absl::Mutex::Await, `mu` is
  // released while waiting and `cond` (which must read only state guarded by `mu`, or atomics)
  // is evaluated again whenever `mu` is released: whoever changes that state under `mu` wakes
  // the waiter, with no signal of its own.
  virtual bool WaitUntil(absl::Mutex& mu, const absl::Condition& cond, int64_t deadline_ms) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
};

// steady_clock milliseconds; waits are real.
class RealClock final : public Clock {
 public:
  int64_t NowMs() const override;
  void SleepForMs(int64_t ms) const override;
  bool WaitUntil(absl::Mutex& mu, const absl::Condition& cond, int64_t deadline_ms) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  static RealClock& Get();
};

}  // namespace mc
