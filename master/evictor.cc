#include "master/evictor.h"

#include <algorithm>

#include "common/logging.h"
#include "master/master_metrics.h"

namespace mc::master {
namespace {

uint64_t MemoryBytes(const Object& object) {
  uint64_t bytes = 0;
  for (const StoredReplica& r : object.replicas) {
    if (r.tier == ReplicaTier::kMemory) bytes += r.length;
  }
  return bytes;
}

// mc_eviction_skipped_total{reason}.
Counter& EvictionSkippedCounter(MetricsRegistry& metrics, const char* reason) {
  return metrics.GetCounter("mc_eviction_skipped_total", "Objects eviction walked past, by reason",
                            {{"reason", reason}});
}

}  // namespace

Evictor::Evictor(ObjectTable& table, SegmentManager& segments, const Clock& clock,
                 MetricsRegistry& metrics, EvictorOptions options,
                 std::function<bool(const std::string&)> disk_capable, int64_t offload_retry_ms)
    : table_(table),
      segments_(segments),
      clock_(clock),
      options_(options),
      disk_capable_(std::move(disk_capable)),
      offload_retry_ms_(offload_retry_ms),
      attempts_(metrics.GetCounter("mc_eviction_attempts_total", "Eviction passes started")),
      successes_(metrics.GetCounter("mc_eviction_successes_total",
                                    "Eviction passes that freed what they were asked")),
      failures_(metrics.GetCounter("mc_eviction_failures_total",
                                   "Eviction passes that ended freeing less than they were asked")),
      evicted_keys_(metrics.GetCounter("mc_evicted_keys_total", "Objects evicted from memory")),
      evicted_bytes_(metrics.GetCounter("mc_evicted_bytes_total", "Memory bytes evicted")),
      skipped_leased_(EvictionSkippedCounter(metrics, "leased")),
      skipped_pinned_(EvictionSkippedCounter(metrics, "pinned")),
      skipped_pending_(EvictionSkippedCounter(metrics, "pending")),
      skipped_write_back_(EvictionSkippedCounter(metrics, "write_back")),
      evicted_unpersisted_(ObjectsLostCounter(metrics, "evicted_unpersisted")) {}

bool Evictor::AwaitsWriteBack(const Object& object, int64_t now) const {
  if (!disk_capable_ || object.HasDiskReplica()) return false;
  const int64_t failed_ms = object.offload_failed_ms();
  if (failed_ms != 0 && now - failed_ms < offload_retry_ms_) {
    return false;  // its client's tier could not take it: no write-back is coming
  }
  for (const StoredReplica& r : object.replicas) {
    if (r.tier == ReplicaTier::kMemory && disk_capable_(r.client_id())) return true;
  }
  return false;
}

std::vector<Evictor::Candidate> Evictor::CollectCandidates(uint64_t bytes, bool persisted_only,
                                                           uint64_t* waiting) {
  int64_t now = clock_.NowMs();
  std::vector<Candidate> candidates;
  table_.ForEachShard([&](ObjectTable::Shard& shard) {
    shard.mu.AssertHeld();
    uint64_t found = 0;
    size_t walked = 0;
    const Object* next = nullptr;
    for (const Object* it = shard.LruOldest();
         it != nullptr && walked < options_.scan_limit_per_shard && found < bytes;
         it = next, ++walked) {
      const Object& object = *it;
      next = object.lru_newer();
      if (object.lru_read) {  // read since it was placed: to the front (CLOCK's second chance)
        shard.SecondChance(object);
        continue;
      }
      uint64_t mem = MemoryBytes(object);
      if (mem == 0) continue;  // already only on disk
      if (persisted_only && !object.HasDiskReplica()) continue;
      if (object.state != ObjectState::kComplete) {
        skipped_pending_.Inc();
      } else if (object.pinned) {
        skipped_pinned_.Inc();
      } else if (shard.HasLiveLease(object, now)) {
        skipped_leased_.Inc();
      } else if (AwaitsWriteBack(object, now)) {
        skipped_write_back_.Inc();
        *waiting += mem;
      } else {
        candidates.push_back({object.access_seq, std::string(object.key()), object.generation, mem,
                              object.HasDiskReplica()});
        found += mem;
      }
    }
  });
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    if (a.persisted != b.persisted) return a.persisted;
    return a.access_seq < b.access_seq;
  });
  return candidates;
}

uint64_t Evictor::EvictCandidates(std::vector<Candidate>& candidates, uint64_t bytes) {
  uint64_t freed = 0;
  int64_t now = clock_.NowMs();
  std::vector<MemoryLocation> to_free;
  for (const Candidate& c : candidates) {
    if (freed >= bytes) break;
    ObjectTable::Shard& shard = table_.ShardOf(c.key);
    absl::MutexLock lock(&shard.mu);
    auto it = shard.objects.find(c.key);
    // Re-check: the object may have been leased, removed or replaced since it was collected.
    if (it == shard.objects.end() || it->second.generation != c.generation) continue;
    const Object& object = it->second;
    if (object.state != ObjectState::kComplete || object.pinned ||
        shard.HasLiveLease(object, now) || AwaitsWriteBack(object, now)) {
      continue;
    }
    uint64_t object_bytes = 0;
    shard.RemoveReplicas(object, [&](const StoredReplica& r) {
      if (r.tier != ReplicaTier::kMemory) return false;
      to_free.push_back(r.location());
      object_bytes += r.length;
      return true;
    });
    if (object.replicas.empty()) {
      evicted_unpersisted_.Inc();
      MC_LOG_EVERY(std::chrono::seconds(5), Logger("master"), warn,
                   "evicted {} with no copy on any SSD tier (none could take it): lost",
                   KeyForLog(c.key));
      shard.Erase(it);
    }
    freed += object_bytes;
    evicted_keys_.Inc();
    evicted_bytes_.Inc(object_bytes);
  }
  for (const MemoryLocation& loc : to_free) segments_.Free(loc);
  return freed;
}

EvictResult Evictor::EvictBytes(uint64_t bytes, bool persisted_only) {
  absl::MutexLock pass(&pass_mu_);
  attempts_.Inc();
  EvictResult result;
  std::vector<Candidate> candidates =
      CollectCandidates(bytes, persisted_only, &result.waiting_write_back);
  result.freed = EvictCandidates(candidates, bytes);
  if (result.freed >= bytes) {
    successes_.Inc();
  } else {
    failures_.Inc();
    MC_LOG_EVERY(std::chrono::seconds(5), Logger("master"), warn,
                 "eviction freed {} of {} bytes asked ({} bytes wait for write-back to SSD): the "
                 "rest is leased, pinned or being written",
                 result.freed, bytes, result.waiting_write_back);
  }
  return result;
}

uint64_t Evictor::EvictToWatermark() {
  SegmentStats stats = segments_.Stats();
  if (stats.capacity == 0) return 0;
  double used = static_cast<double>(stats.used) / static_cast<double>(stats.capacity);
  if (used <= options_.high_watermark) return 0;
  uint64_t target = static_cast<uint64_t>(options_.low_watermark * stats.capacity);
  return Evict(stats.used - target);
}

bool Evictor::MakeRoomUnderHighWatermark(uint64_t bytes) {
  SegmentStats stats = segments_.Stats();
  const auto limit =
      static_cast<uint64_t>(options_.high_watermark * static_cast<double>(stats.capacity));
  if (stats.used + bytes <= limit) return true;
  Evict(stats.used + bytes - limit, /*persisted_only=*/true);
  stats = segments_.Stats();
  return stats.used + bytes <= limit;
}

EvictionStats Evictor::Stats() const {
  return EvictionStats{attempts_.Value(),           successes_.Value(),
                       failures_.Value(),           evicted_keys_.Value(),
                       evicted_bytes_.Value(),      skipped_leased_.Value(),
                       skipped_pinned_.Value(),     skipped_pending_.Value(),
                       skipped_write_back_.Value(), evicted_unpersisted_.Value()};
}

}  // namespace mc::master
