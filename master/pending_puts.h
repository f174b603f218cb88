// PendingPuts: the puts started and not yet ended or revoked, ordered by their deadline, so the
// put-timeout sweep reads only the expired front instead of scanning the object table.
// Thread-safe (a leaf lock: nothing is called while it is held).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace mc::master {

class PendingPuts {
 public:
  // A put's place in the order: its deadline, then its generation (PutCoordinator::PendingKeyOf).
  struct Key {
    int64_t deadline_ms;
    uint64_t generation;
  };
  struct Entry {
    std::string key;
    uint64_t generation;
  };
  void Add(Key at, std::string key) {
    absl::MutexLock lock(&mu_);
    by_deadline_.emplace(std::make_pair(at.deadline_ms, at.generation), std::move(key));
  }
  void Remove(Key at) {
    absl::MutexLock lock(&mu_);
    by_deadline_.erase({at.deadline_ms, at.generation});
  }
  // Removes and returns the entries whose deadline is at or before `now_ms`.
  std::vector<Entry> TakeExpired(int64_t now_ms) {
    absl::MutexLock lock(&mu_);
    std::vector<Entry> out;
    auto it = by_deadline_.begin();
    while (it != by_deadline_.end() && it->first.first <= now_ms) {
      out.push_back({std::move(it->second), it->first.second});
      it = by_deadline_.erase(it);
    }
    return out;
  }
  size_t Size() const {
    absl::MutexLock lock(&mu_);
    return by_deadline_.size();
  }

 private:
  mutable absl::Mutex mu_;
  std::map<std::pair<int64_t, uint64_t>, std::string> by_deadline_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mc::master
