#include "master/offload_planner.h"

namespace mc::master {

void OffloadQueue::Push(const std::string& client_id, OffloadTask task) {
  absl::MutexLock lock(&mu_);
  queues_[client_id].push_back(std::move(task));
}

std::vector<OffloadTask> OffloadQueue::Take(const std::string& client_id, size_t max) {
  absl::MutexLock lock(&mu_);
  std::vector<OffloadTask> out;
  auto it = queues_.find(client_id);
  if (it == queues_.end()) return out;
  while (!it->second.empty() && out.size() < max) {
    out.push_back(std::move(it->second.front()));
    it->second.pop_front();
  }
  return out;
}

size_t OffloadQueue::Pending(const std::string& client_id) const {
  absl::MutexLock lock(&mu_);
  auto it = queues_.find(client_id);
  return it == queues_.end() ? 0 : it->second.size();
}

std::vector<OffloadTask> OffloadQueue::DropClient(const std::string& client_id) {
  absl::MutexLock lock(&mu_);
  std::vector<OffloadTask> out;
  auto it = queues_.find(client_id);
  if (it == queues_.end()) return out;
  std::deque<OffloadTask> kept;
  for (OffloadTask& t : it->second) {
    if (t.kind == OffloadTask::Kind::kDrop) {
      kept.push_back(std::move(t));
    } else {
      out.push_back(std::move(t));
    }
  }
  it->second = std::move(kept);
  return out;
}

bool OffloadQueue::HasPendingDrop(const std::string& client_id, std::string_view key,
                                  uint64_t generation) const {
  absl::MutexLock lock(&mu_);
  auto it = queues_.find(client_id);
  if (it == queues_.end()) return false;
  for (const OffloadTask& t : it->second) {
    if (t.kind == OffloadTask::Kind::kDrop && t.generation == generation && t.key == key) {
      return true;
    }
  }
  return false;
}

OffloadPlanner::OffloadPlanner(ObjectTable& table, SegmentManager& segments, OffloadQueue& queue,
                               std::function<bool(const std::string&)> disk_capable,
                               const Clock& clock, MetricsRegistry& metrics,
                               OffloadPlannerOptions options)
    : table_(table),
      segments_(segments),
      queue_(queue),
      disk_capable_(std::move(disk_capable)),
      clock_(clock),
      options_(options),
      planned_(metrics.GetCounter("mc_offloads_planned_total",
                                  "Objects the master asked a client to persist")) {}

size_t OffloadPlanner::Plan() {
  SegmentStats stats = segments_.Stats();
  if (stats.capacity == 0 ||
      static_cast<double>(stats.used) <= options_.watermark * static_cast<double>(stats.capacity)) {
    return 0;
  }
  absl::flat_hash_map<std::string, size_t> room;  // per client: tasks it may still be given
  auto room_of = [&](const std::string& client) -> size_t& {
    auto it = room.find(client);
    if (it != room.end()) return it->second;
    size_t pending = queue_.Pending(client);
    size_t r = disk_capable_(client) && pending < options_.max_pending_per_client
                   ? options_.max_pending_per_client - pending
                   : 0;
    return room.emplace(client, r).first->second;
  };
  size_t queued = 0;
  int64_t now = clock_.NowMs();
  table_.ForEachShard([&](ObjectTable::Shard& shard) {
    shard.mu.AssertHeld();
    size_t walked = 0;
    const Object* next = nullptr;
    for (const Object* it = shard.LruOldest();
         it != nullptr && walked < options_.scan_limit_per_shard; it = next, ++walked) {
      const Object& object = *it;
      next = object.lru_newer();
      if (object.lru_read) {  // read since it was placed: not cold (CLOCK's second chance)
        shard.SecondChance(object);
        continue;
      }
      // Expired marks read as none (here and in the evictor, which uses the same timeout): drop
      // them, so the object's side record goes once nothing else is in it.
      shard.ExpireOffloadMarks(object, now, options_.task_timeout_ms);
      const bool in_flight = object.offload_queued_ms() != 0;
      const bool failed_lately = object.offload_failed_ms() != 0;
      if (object.state != ObjectState::kComplete || in_flight || failed_lately ||
          !object.HasMemoryReplica() || object.HasDiskReplica()) {
        continue;
      }
      for (const StoredReplica& r : object.replicas) {
        if (r.tier != ReplicaTier::kMemory) continue;
        size_t& left = room_of(r.client_id());
        if (left == 0) continue;
        --left;
        queue_.Push(
            r.client_id(),
            OffloadTask{OffloadTask::Kind::kOffload, std::string(object.key()), object.generation,
                        object.size, object.checksum, r.segment_id, r.offset, 0});
        shard.MarkOffloadQueued(object, now);
        ++queued;
        break;
      }
    }
  });
  planned_.Inc(queued);
  return queued;
}

}  // namespace mc::master
