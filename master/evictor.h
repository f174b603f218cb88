// Evictor: frees memory by dropping the memory replicas of least recently used objects.
//
// LRU, persisted objects first: each shard's LRU list is walked from its cold end (bounded per
// shard, so approximate when a shard's cold end is all ineligible), the eligible candidates of
// all shards are merged (objects with a DISK replica first, then by a process-wide access
// sequence), and evicted in that order until the requested bytes are freed. Eligible means
// COMPLETE, no live lease, not pinned; every other object walked is counted as a skip by reason.
// An object keeps its DISK replicas (it stays readable from the SSD tier); one left with no
// replica is erased.
// Write-back (DESIGN.md invariant 7): an object with no DISK replica whose memory replica sits on
// a client with an SSD tier is not eligible: its last copy leaves memory only once the planner's
// OFFLOAD made it durable and reported it. Such objects are counted as waiting (EvictResult), so
// PutStart can answer "wait for write-back" instead of NO_SPACE for good. An object no tier can
// take (no SSD tier on its replicas' clients, or its client reported the offload failed) is
// eligible after every persisted one, and dropping its last copy is counted as
// mc_objects_lost_total{reason="evicted_unpersisted"}. Each Evict() call is one attempt, counted
// when it starts; when it ends it is a success (it freed at least what was asked) or a failure. A
// reader of the counters may see the pass that has started and not ended, so attempts can exceed
// successes + failures by one: judge eviction by failures, not by the difference. Thread-safe;
// passes are serialized by an internal mutex. Takes shard locks one at a time, then
// SegmentManager's lock (the table's lock order).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "master/object_table.h"
#include "master/segment_manager.h"

namespace mc::master {

struct EvictorOptions {
  double high_watermark = 0.95;    // background pass starts above this fraction used
  double low_watermark = 0.90;     // and evicts down to this
  size_t scan_limit_per_shard = 4096;  // objects walked per shard per pass
};

struct EvictResult {
  uint64_t freed = 0;
  // Memory bytes of eligible-but-for-write-back objects seen: freed once their offload ends.
  uint64_t waiting_write_back = 0;
};

struct EvictionStats {
  uint64_t attempts = 0;
  uint64_t successes = 0;
  uint64_t failures = 0;
  uint64_t evicted_keys = 0;
  uint64_t evicted_bytes = 0;
  uint64_t skipped_leased = 0;
  uint64_t skipped_pinned = 0;
  uint64_t skipped_pending = 0;
  uint64_t skipped_write_back = 0;
  uint64_t evicted_unpersisted = 0;
};

class Evictor {
 public:
  // `disk_capable(client_id)` tells whether a client has an SSD tier (nullptr: none has);
  // called with a shard lock held. `offload_retry_ms`: how long a reported offload failure
  // makes an object evictable unpersisted (the planner's task timeout).
  Evictor(ObjectTable& table, SegmentManager& segments, const Clock& clock,
          MetricsRegistry& metrics, EvictorOptions options,
          std::function<bool(const std::string&)> disk_capable = nullptr,
          int64_t offload_retry_ms = 60'000);

  // One attempt to free `bytes` of memory.
  // With `persisted_only`, only objects that also have a DISK replica lose their memory replica
  // (a promotion must never destroy the only copy of another object to make room for a copy).
  EvictResult EvictBytes(uint64_t bytes, bool persisted_only = false);
  // EvictBytes(...).freed.
  uint64_t Evict(uint64_t bytes, bool persisted_only = false) {
    return EvictBytes(bytes, persisted_only).freed;
  }
  // When memory use is above the high watermark, evicts down to the low one. Returns bytes freed.
  uint64_t EvictToWatermark();
  // Whether `bytes` more keep memory at or below the high watermark, after evicting persisted
  // objects (only) to make it so. Promotions ask first: memory filled past the mark would make
  // the next background pass evict the coldest objects, whatever they are.
  bool MakeRoomUnderHighWatermark(uint64_t bytes);

  EvictionStats Stats() const;
  const EvictorOptions& options() const { return options_; }

 private:
  struct Candidate {
    uint64_t access_seq;
    std::string key;
    uint64_t generation;
    uint64_t bytes;
    bool persisted;  // has a DISK replica: dropping its memory loses nothing
  };
  // Whether an object without a DISK replica must wait for its write-back before it may go.
  bool AwaitsWriteBack(const Object& object, int64_t now) const;
  std::vector<Candidate> CollectCandidates(uint64_t bytes, bool persisted_only, uint64_t* waiting);
  uint64_t EvictCandidates(std::vector<Candidate>& candidates, uint64_t bytes);

  ObjectTable& table_;
  SegmentManager& segments_;
  const Clock& clock_;
  const EvictorOptions options_;
  const std::function<bool(const std::string&)> disk_capable_;
  const int64_t offload_retry_ms_;
  Counter& attempts_;
  Counter& successes_;
  Counter& failures_;
  Counter& evicted_keys_;
  Counter& evicted_bytes_;
  Counter& skipped_leased_;
  Counter& skipped_pinned_;
  Counter& skipped_pending_;
  Counter& skipped_write_back_;
  Counter& evicted_unpersisted_;
  absl::Mutex pass_mu_;  // one pass at a time
};

}  // namespace mc::master
