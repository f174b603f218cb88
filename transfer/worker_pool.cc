#include "transfer/worker_pool.h"

#include <algorithm>

namespace mc::transfer {

// One Run() call: parts are claimed through `next`; `finished` counts returned calls.
struct WorkerPool::Job {
  const std::function<void(size_t)>* fn;  // valid until finished == n (the caller waits)
  size_t n;
  std::atomic<size_t> next{0};
  absl::Mutex mu;
  size_t finished ABSL_GUARDED_BY(mu) = 0;

  // Claims and runs parts until none is left.
  void Participate() {
    size_t ran = 0;
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      (*fn)(i);
      ++ran;
    }
    if (ran > 0) {
      absl::MutexLock lock(&mu);
      finished += ran;
    }
  }
};

WorkerPool::WorkerPool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::Loop() {
  while (true) {
    std::shared_ptr<Job> job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping and drained
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job->Participate();  // a late helper finds nothing left and returns at once
  }
}

void WorkerPool::Run(size_t n, const std::function<void(size_t)>& fn, int parallelism) {
  if (n == 0) return;
  const int most = size() + 1;
  if (parallelism <= 0 || parallelism > most) parallelism = most;
  const size_t helpers = std::min<size_t>(static_cast<size_t>(parallelism - 1), n - 1);
  if (helpers == 0) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->n = n;
  {
    absl::MutexLock lock(&mu_);
    for (size_t h = 0; h < helpers; ++h) queue_.push_back(job);
  }
  job->Participate();
  absl::MutexLock lock(&job->mu);
  auto all_done = [&job]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu) { return job->finished == job->n; };
  job->mu.Await(absl::Condition(&all_done));
}

}  // namespace mc::transfer
