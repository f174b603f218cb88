#include "client/batch/speculative_copier.h"

#include <utility>

#include "client/batch/batch_get.h"

namespace mc::client {

class SpeculativeCopier::Job {
 public:
  explicit Job(std::vector<Item> items) : items_(std::move(items)), state_(items_.size()) {
    for (auto& s : state_) s.store(kPending, std::memory_order_relaxed);
  }

  // Copies item i when it is still pending (on whichever thread claims it first).
  void TryCopy(size_t i) {
    uint8_t pending = kPending;
    if (!state_[i].compare_exchange_strong(pending, kClaimed, std::memory_order_acq_rel)) return;
    Item& item = items_[i];
    uint64_t copied = 0;
    item.checksum = ScatterCopyChecksum({LocalBuffer{const_cast<char*>(item.src), item.size}},
                                        item.dest, &copied);
    item.copied = copied == item.size;
    state_[i].store(kDone, std::memory_order_release);
  }
  void Cancel(size_t i) {
    uint8_t pending = kPending;
    state_[i].compare_exchange_strong(pending, kCancelled, std::memory_order_acq_rel);
  }
  // The helper's run: every item it can claim.
  void Run() {
    for (size_t i = 0; i < items_.size(); ++i) TryCopy(i);
  }
  // The job is over for the helper (after it became free for the next job, so that the get
  // that waited for it finds the helper free for its next call).
  void HelperDone() {
    absl::MutexLock lock(&mu_);
    helper_done_ = true;
  }
  void AwaitHelper() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&helper_done_));
  }
  std::vector<Item>& items() { return items_; }

 private:
  static constexpr uint8_t kPending = 0, kClaimed = 1, kDone = 2, kCancelled = 3;
  std::vector<Item> items_;
  std::vector<std::atomic<uint8_t>> state_;
  absl::Mutex mu_;
  bool helper_done_ ABSL_GUARDED_BY(mu_) = false;
};

SpeculativeCopier::SpeculativeCopier() : thread_([this] { Loop(); }) {}

SpeculativeCopier::~SpeculativeCopier() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

std::shared_ptr<SpeculativeCopier::Job> SpeculativeCopier::TryStart(std::vector<Item> items) {
  if (items.empty()) return nullptr;
  absl::MutexLock lock(&mu_);
  if (busy_ || stopping_) return nullptr;
  busy_ = true;
  next_ = std::make_shared<Job>(std::move(items));
  return next_;
}

std::vector<SpeculativeCopier::Item>& SpeculativeCopier::Finish(Job& job,
                                                                const std::vector<bool>& wanted) {
  for (size_t i = 0; i < job.items().size(); ++i) {
    if (i < wanted.size() && wanted[i]) {
      job.TryCopy(i);
    } else {
      job.Cancel(i);
    }
  }
  job.AwaitHelper();  // at most the one item it was copying
  return job.items();
}

void SpeculativeCopier::Loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return next_ != nullptr || stopping_; };
      mu_.Await(absl::Condition(&ready));
      if (next_ == nullptr) return;  // stopping, nothing handed over
      job = std::move(next_);
      next_ = nullptr;
    }
    job->Run();
    {
      absl::MutexLock lock(&mu_);
      busy_ = false;
    }
    job->HelperDone();
  }
}

}  // namespace mc::client
