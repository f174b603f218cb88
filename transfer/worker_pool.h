// WorkerPool: a few helper threads that a transport borrows to run the parts of one batch in
// parallel with the calling thread (local copies of different requests, tcp poll loops of
// different connection groups). Internal to mc_transfer.
// Run(n, fn) calls fn(0) .. fn(n-1), each exactly once, on the caller and on up to size()
// helpers; parts are claimed dynamically, so a caller whose helpers are busy with another batch
// simply runs the remaining parts itself (no waiting on a queue, no nested waits, no deadlock).
// Thread-safe: Run() may be called concurrently from many threads.
#pragma once

#include <atomic>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace mc::transfer {

class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }
  // Runs fn(i) for every i in [0, n) on at most `parallelism` threads (caller included; <= 0 or
  // more than size()+1 means size()+1); returns when every call returned. `fn` must not throw.
  void Run(size_t n, const std::function<void(size_t)>& fn, int parallelism = 0);

 private:
  struct Job;
  void Loop();

  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  std::deque<std::shared_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace mc::transfer
