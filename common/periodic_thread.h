// PeriodicThread: a thread that runs a task, waits, and runs it again until stopped: the
// daemons' heartbeat, poll and maintenance loops.
//
// The task returns how long to wait before its next run, in ms of the given Clock (0: run again
// at once, after checking for Stop; kStop: the thread ends; other negative values count as 0). The
// waits go through Clock::WaitUntil, so a test drives the loop with a FakeClock
// (tests/fakes/fake_clock.h) instead of sleeping. Stop() ends a wait at once and joins after the
// running task returns; a long task checks stopping() between its steps. WakeNow() ends the current
// wait (or the next one, when the task is running) early. runs() counts completed runs, for tests
// and status. Thread-safe; Stop() must not be called from the task.
#pragma once

#include <cstdint>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace mc {

class PeriodicThread {
 public:
  static constexpr int64_t kStop = -1;
  using Task = std::function<int64_t()>;

  // `clock` is borrowed and must outlive this.
  PeriodicThread(const Clock& clock, Task task);
  ~PeriodicThread();  // Stop()
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

  // Starts the thread; the first run comes after `first_delay_ms` (<= 0: at once). Only the first
  // call (before any Stop) starts it.
  void Start(int64_t first_delay_ms) ABSL_LOCKS_EXCLUDED(mu_, thread_mu_);
  // Stops the thread and joins it; idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_, thread_mu_);
  // The task runs at once, not at the end of the current wait.
  void WakeNow() ABSL_LOCKS_EXCLUDED(mu_);

  bool stopping() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t runs() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop(int64_t first_delay_ms) ABSL_LOCKS_EXCLUDED(mu_);

  const Clock& clock_;
  const Task task_;

  absl::Mutex thread_mu_;  // Start and Stop, whoever calls them
  std::thread thread_ ABSL_GUARDED_BY(thread_mu_);

  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(thread_mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t runs_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mc
