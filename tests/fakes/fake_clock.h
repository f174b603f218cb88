// A Clock that moves only when a test says so, or when code under test sleeps on it.
//
// - AdvanceMs / SetMs move the time and wake every WaitUntil whose deadline they reach (a
//   periodic loop on this clock runs its next round when the test advances past its period).
// - SleepForMs advances the clock by the time slept, at once: what the code under test pauses
//   for (a retry backoff) costs the test nothing, and the pause is visible as time. An optional
//   hook runs first, on the sleeper's thread (a test releases a resource "while it waits").
// - WaitUntil blocks until its condition holds or the test moves the clock to its deadline.
// - waits_begun() counts WaitUntil calls: a loop thread that comes back to wait has finished
//   the round it was woken for, which is how a test knows "the round ran" without sleeping
//   (AwaitWaitsBegun). waiting() is how many threads wait now.
// Thread-safe. Lock order: the clock's own mutex before any waiter's mutex (a waiter never holds
// its mutex while it takes the clock's).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace mc {

class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = 1'000'000) : now_ms_(start_ms) {}

  int64_t NowMs() const override { return now_ms_.load(); }
  void AdvanceMs(int64_t ms) const { SetMsLocked(ms, /*relative=*/true); }
  void SetMs(int64_t ms) const { SetMsLocked(ms, /*relative=*/false); }

  void SleepForMs(int64_t ms) const override {
    std::function<void(int64_t)> hook;
    {
      absl::MutexLock lock(&mu_);
      ++sleeps_;
      hook = on_sleep_;
    }
    if (hook) hook(ms);
    if (ms > 0) AdvanceMs(ms);
  }

  bool WaitUntil(absl::Mutex& mu, const absl::Condition& cond, int64_t deadline_ms) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (cond.Eval()) return true;
    // Registered (and unregistered) without `mu` held: AdvanceMs takes the clock's mutex and
    // then each waiter's, so holding `mu` here would invert that order.
    mu.Unlock();
    {
      absl::MutexLock lock(&mu_);
      ++waiters_[&mu];
      ++waits_begun_;
    }
    mu.Lock();
    struct Done {
      const absl::Condition* cond;
      const FakeClock* clock;
      int64_t deadline_ms;
      bool operator()() const { return cond->Eval() || clock->NowMs() >= deadline_ms; }
    } done{&cond, this, deadline_ms};
    mu.Await(absl::Condition(&done));
    mu.Unlock();
    {
      absl::MutexLock lock(&mu_);
      if (--waiters_[&mu] == 0) waiters_.erase(&mu);
    }
    mu.Lock();
    return cond.Eval();
  }

  // Runs `hook(ms)` on the sleeper's thread at every SleepForMs, before the clock moves.
  void SetOnSleep(std::function<void(int64_t ms)> hook) {
    absl::MutexLock lock(&mu_);
    on_sleep_ = std::move(hook);
  }
  uint64_t sleeps() const {
    absl::MutexLock lock(&mu_);
    return sleeps_;
  }
  uint64_t waits_begun() const {
    absl::MutexLock lock(&mu_);
    return waits_begun_;
  }
  size_t waiting() const {
    absl::MutexLock lock(&mu_);
    return waiting_locked();
  }
  // Blocks (real time, at most `timeout`) until `n` WaitUntil calls have begun; true if they did.
  bool AwaitWaitsBegun(uint64_t n, absl::Duration timeout = absl::Seconds(10)) const {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waits_begun_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }
  // Blocks (real time, at most `timeout`) until `n` threads wait on this clock; true if they do.
  bool AwaitWaiting(size_t n, absl::Duration timeout = absl::Seconds(10)) const {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waiting_locked() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }

 private:
  size_t waiting_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    size_t n = 0;
    for (const auto& [waiter, count] : waiters_) n += count;
    return n;
  }
  void SetMsLocked(int64_t ms, bool relative) const {
    absl::MutexLock lock(&mu_);
    if (relative) {
      now_ms_.fetch_add(ms);
    } else {
      now_ms_.store(ms);
    }
    // Releasing a waiter's mutex makes absl evaluate its condition again, the deadline included.
    for (const auto& waiter : waiters_) {
      waiter.first->Lock();
      waiter.first->Unlock();
    }
  }

  mutable std::atomic<int64_t> now_ms_;
  mutable absl::Mutex mu_;
  // The mutexes threads wait on in WaitUntil, and how many threads wait on each.
  mutable absl::flat_hash_map<absl::Mutex*, size_t> waiters_ ABSL_GUARDED_BY(mu_);
  mutable uint64_t waits_begun_ ABSL_GUARDED_BY(mu_) = 0;
  mutable uint64_t sleeps_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(int64_t)> on_sleep_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mc
