// Waiting in tests without fixed sleeps.
//
// - EventCounter: a counter that code under test (a callback, a hook) bumps and the test waits
//   on: AwaitAtLeast(n) returns as soon as the n-th event happened.
// - WaitFor(condition): for state that signals nothing (a counter of another component, a
//   socket the kernel closes): checks `condition` until it holds or the timeout passes, with
//   short pauses in between. Prefer an event (EventCounter, absl::Notification, a FakeClock
//   wait: tests/fakes/fake_clock.h) where the code offers one.
// Both wait at most `timeout` of real time, so a broken build fails instead of hanging; the
// timeouts are generous because a loaded CI machine is slow, and a passing test never waits
// for them.
#pragma once

#include <algorithm>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace mc {

inline constexpr absl::Duration kAwaitTimeout = absl::Seconds(30);

class EventCounter {
 public:
  void Add(int64_t n = 1) {
    absl::MutexLock lock(&mu_);
    value_ += n;
  }
  int64_t value() const {
    absl::MutexLock lock(&mu_);
    return value_;
  }
  // True once the counter reached `n`; false after `timeout`.
  bool AwaitAtLeast(int64_t n, absl::Duration timeout = kAwaitTimeout) const {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return value_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }

 private:
  mutable absl::Mutex mu_;
  int64_t value_ ABSL_GUARDED_BY(mu_) = 0;
};

// True once `condition()` holds; false if it still does not after `timeout`.
template <typename Condition>
bool WaitFor(Condition condition, absl::Duration timeout = kAwaitTimeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Microseconds(100);
  while (!condition()) {
    if (absl::Now() >= deadline) return condition();
    absl::SleepFor(pause);  // the one pause of the tests' polls
    pause = std::min(pause * 2, absl::Milliseconds(10));
  }
  return true;
}

}  // namespace mc
