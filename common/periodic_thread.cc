#include "common/periodic_thread.h"

#include <limits>
#include <utility>

namespace mc {

PeriodicThread::PeriodicThread(const Clock& clock, Task task)
    : clock_(clock), task_(std::move(task)) {}

PeriodicThread::~PeriodicThread() { Stop(); }

void PeriodicThread::Start(int64_t first_delay_ms) {
  absl::MutexLock thread_lock(&thread_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (started_ || stopping_) return;
    started_ = true;
  }
  thread_ = std::thread([this, first_delay_ms] { Loop(first_delay_ms); });
}

void PeriodicThread::Stop() {
  absl::MutexLock thread_lock(&thread_mu_);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;  // wakes the wait: its condition reads it
  }
  if (thread_.joinable()) thread_.join();
}

void PeriodicThread::WakeNow() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
}

bool PeriodicThread::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

uint64_t PeriodicThread::runs() const {
  absl::MutexLock lock(&mu_);
  return runs_;
}

void PeriodicThread::Loop(int64_t first_delay_ms) {
  int64_t wait_ms = first_delay_ms;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (wait_ms > 0 && !stopping_) {
        int64_t deadline;
        if (__builtin_add_overflow(clock_.NowMs(), wait_ms, &deadline)) {
          deadline = std::numeric_limits<int64_t>::max();
        }
        auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || wake_; };
        clock_.WaitUntil(mu_, absl::Condition(&woken), deadline);
      }
      wake_ = false;
      if (stopping_) return;
    }
    wait_ms = task_();
    absl::MutexLock lock(&mu_);
    ++runs_;
    if (wait_ms == kStop) return;
  }
}

}  // namespace mc
