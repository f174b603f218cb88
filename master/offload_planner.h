// The master's side of the SSD tier: which objects to persist, and the task queues that carry
// that work (and record deletions) to the clients that own the bytes.
//
// OffloadPlanner::Plan() runs in the maintenance loop. Above the offload watermark (a fraction of
// memory capacity) it walks each shard's LRU list from the cold end and queues, for COMPLETE,
// memory-only, not-yet-queued objects, an OFFLOAD task to a client that holds a memory replica
// and has an SSD tier. The client persists the bytes (verifying them against the checksum in the
// task) and reports a DISK replica; the Evictor then prefers persisted objects, so eviction drops
// memory that is already safe on disk. DROP tasks ask a client to delete a record whose object
// was removed. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "master/object_table.h"
#include "master/segment_manager.h"

namespace mc::master {

struct OffloadTask {
  enum class Kind { kOffload, kDrop };
  Kind kind = Kind::kOffload;
  std::string key;
  uint64_t generation = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
  uint64_t segment_id = 0;  // kOffload: the memory replica to persist
  uint64_t offset = 0;
  uint64_t locator = 0;     // kDrop: the record to delete
};

// Per-client FIFO queues of tasks. Thread-safe (a leaf lock).
class OffloadQueue {
 public:
  void Push(const std::string& client_id, OffloadTask task);
  std::vector<OffloadTask> Take(const std::string& client_id, size_t max);
  size_t Pending(const std::string& client_id) const;
  // Forgets a client's OFFLOAD tasks (it died or re-registered; their memory replicas are gone)
  // and returns them. DROP tasks stay: the records they name outlive the daemon on its disk.
  std::vector<OffloadTask> DropClient(const std::string& client_id);
  // Whether a DROP of (key, generation) waits for the client: its record must not come back.
  bool HasPendingDrop(const std::string& client_id, std::string_view key,
                      uint64_t generation) const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::deque<OffloadTask>> queues_ ABSL_GUARDED_BY(mu_);
};

struct OffloadPlannerOptions {
  double watermark = 0.5;              // plan offloads while memory use is above this fraction
  size_t max_pending_per_client = 512; // tasks queued and not yet taken, per client
  size_t scan_limit_per_shard = 1024;  // objects walked per shard per pass
  int64_t task_timeout_ms = 60'000;    // a task not reported by then may be queued again
};

class OffloadPlanner {
 public:
  // `disk_capable(client_id)` tells whether a client has an SSD tier.
  OffloadPlanner(ObjectTable& table, SegmentManager& segments, OffloadQueue& queue,
                 std::function<bool(const std::string&)> disk_capable, const Clock& clock,
                 MetricsRegistry& metrics, OffloadPlannerOptions options);

  // One planning pass; returns the number of tasks queued.
  size_t Plan();

 private:
  ObjectTable& table_;
  SegmentManager& segments_;
  OffloadQueue& queue_;
  const std::function<bool(const std::string&)> disk_capable_;
  const Clock& clock_;
  const OffloadPlannerOptions options_;
  Counter& planned_;
};

}  // namespace mc::master
