#include "client/batch/speculative_copier.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/checksum.h"

namespace mc::client {

class SpeculativeCopier::Job {
 public:
  Job(SpeculativeCopier& copier, std::vector<Item> items)
      : copier_(copier), items_(std::move(items)), state_(items_.size()), abandon_(items_.size()) {
    for (auto& s : state_) s.store(kPending, std::memory_order_relaxed);
    for (auto& a : abandon_) a.store(false, std::memory_order_relaxed);
  }

  // The helper's run: every item not cancelled yet, in order.
  void Run() {
    for (size_t i = 0; i < items_.size(); ++i) Copy(i);
  }
  // The job is over for the helper (after it became free for the next job, so that the get
  // that waited for it finds the helper free for its next call).
  void HelperDone() {
    absl::MutexLock lock(&mu_);
    helper_done_ = true;
  }
  // The getter's side of SpeculativeCopier::Finish, before waiting for the helper.
  void Settle(const std::vector<bool>& wanted) {
    for (size_t i = 0; i < items_.size(); ++i) {
      if (i < wanted.size() && wanted[i]) continue;
      abandon_[i].store(true, std::memory_order_relaxed);
      uint8_t pending = kPending;
      state_[i].compare_exchange_strong(pending, kCancelled, std::memory_order_acq_rel);
    }
    // The wanted items the helper has not claimed yet are copied here, from the last one back
    // while the helper goes on from the first: two threads finish the job.
    for (size_t i = std::min(items_.size(), wanted.size()); i-- > 0;) {
      if (wanted[i] && Copy(i)) items_[i].after_answer = true;
    }
  }
  std::vector<Item>& AwaitHelper() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&helper_done_));
    return items_;
  }
  std::vector<Item>& items() { return items_; }
  SpeculativeCopier& copier() { return copier_; }

 private:
  static constexpr uint8_t kPending = 0, kClaimed = 1, kDone = 2, kCancelled = 3;
  static constexpr uint64_t kChunk = 256 << 10;  // hashed from the destination while cache-hot

  // Copies item i unless another thread claimed it or it was cancelled (false then); an
  // abandoned item stops at the next chunk (not copied).
  bool Copy(size_t i) {
    uint8_t pending = kPending;
    if (!state_[i].compare_exchange_strong(pending, kClaimed, std::memory_order_acq_rel)) {
      return false;
    }
    Item& item = items_[i];
    StreamingChecksum sum;
    uint64_t pos = 0;
    bool whole = true;
    for (const LocalBuffer& d : item.dest) {
      for (uint64_t off = 0; whole && off < d.length && pos < item.size;) {
        if (abandon_[i].load(std::memory_order_relaxed)) {
          whole = false;
          break;
        }
        const uint64_t n = std::min({kChunk, d.length - off, item.size - pos});
        std::memcpy(d.data + off, item.src + pos, n);
        sum.Update(d.data + off, n);
        off += n;
        pos += n;
      }
    }
    item.copied = whole && pos == item.size && pos == TotalLength(item.dest);
    item.checksum = sum.Digest();
    state_[i].store(kDone, std::memory_order_release);
    return true;
  }

  SpeculativeCopier& copier_;  // the one that started it (it outlives its jobs' Finish)
  std::vector<Item> items_;
  std::vector<std::atomic<uint8_t>> state_;
  std::vector<std::atomic<bool>> abandon_;
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
  next_ = std::make_shared<Job>(*this, std::move(items));
  return next_;
}

std::vector<SpeculativeCopier::Item>& SpeculativeCopier::Finish(Job& job,
                                                                const std::vector<bool>& wanted) {
  job.Settle(wanted);
  return job.copier().TakeBack(job) ? job.items() : job.AwaitHelper();
}

bool SpeculativeCopier::TakeBack(const Job& job) {
  absl::MutexLock lock(&mu_);
  if (next_.get() != &job) return false;
  next_ = nullptr;  // the helper never took it: nobody else touches it
  busy_ = false;
  return true;
}

void SpeculativeCopier::PauseForTest(bool paused) {
  absl::MutexLock lock(&mu_);
  paused_ = paused;
}

bool SpeculativeCopier::busy() const {
  absl::MutexLock lock(&mu_);
  return busy_;
}

void SpeculativeCopier::Loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return (next_ != nullptr && !paused_) || stopping_;
      };
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
