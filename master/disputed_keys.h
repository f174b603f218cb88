// DisputedKeys: the keys whose object reports conflicted (ObjectReports), remembered so that no
// later report restores either version until a put of this run ends (PutCoordinator forgets the
// key then). At most kMaxDisputedKeys are remembered; beyond that every key counts as disputed
// (fail closed). Thread-safe (a leaf lock, taken under a shard's).
#pragma once

#include <atomic>
#include <cstddef>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace mc::master {

// Keys whose reports conflicted, remembered so no later report restores either version.
inline constexpr size_t kMaxDisputedKeys = 100'000;

class DisputedKeys {
 public:
  // Whether `key` is disputed (or the set is full).
  bool Contains(std::string_view key) {
    if (!any_.load()) return false;
    absl::MutexLock lock(&mu_);
    return keys_.size() >= kMaxDisputedKeys ||
           keys_.contains(absl::string_view(key.data(), key.size()));
  }
  void Add(std::string_view key) {
    absl::MutexLock lock(&mu_);
    if (keys_.size() < kMaxDisputedKeys) keys_.insert(std::string(key));
    any_.store(true);
  }
  // After a put of `key` ended: this run vouches for it again.
  void Forget(std::string_view key) {
    if (!any_.load()) return;
    absl::MutexLock lock(&mu_);
    keys_.erase(absl::string_view(key.data(), key.size()));
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_set<std::string> keys_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> any_{false};
};

}  // namespace mc::master
