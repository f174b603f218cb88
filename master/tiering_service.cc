// DISK replicas: the records clients' SSD tiers persisted, dropped, or recovered at start; the
// offload tasks and planner kicks.
#include "master/tiering_service.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "master/master_metrics.h"

namespace mc::master {

TieringService::TieringService(MasterTables& tables, PutCoordinator& puts)
    : options_(tables.options),
      clock_(tables.clock),
      table_(tables.table),
      segments_(tables.segments),
      clients_(tables.clients),
      offload_queue_(tables.offload_queue),
      evictor_(tables.evictor),
      planner_(tables.planner),
      puts_(puts),
      disk_reclaimed_lost_(ObjectsLostCounter(tables.metrics, "ssd_reclaimed")),
      offload_failures_(tables.metrics.GetCounter(
          "mc_offload_failures_reported_total",
          "OFFLOAD tasks clients reported they could not persist (tier full or failing)")),
      corrupt_records_(tables.metrics.GetCounter(
          "mc_disk_replicas_corrupt_total",
          "DISK replicas dropped because their record failed verification when read")),
      corrupt_lost_(ObjectsLostCounter(tables.metrics, "corrupt")),
      disk_reports_refused_(tables.metrics.GetCounter(
          "mc_master_disk_reports_refused_total",
          "Recovered DISK records refused because the master knows the key with another "
          "generation, length or checksum (the known object is kept)")),
      corrupt_disk_replicas_(ReplicasDroppedCounter(tables.metrics, "disk", "corrupt")) {}

std::vector<absl::Status> TieringService::AddDiskReplicas(
    const std::string& client_id, const std::vector<DiskReplicaItem>& items, bool recovered,
    const std::vector<DiskReplicaItem>& failed) {
  if (!failed.empty()) MarkOffloadsFailed(client_id, failed);
  std::optional<ClientInfo> client = clients_.Get(client_id);
  uint64_t max_generation = 0;
  size_t created = 0;
  std::vector<absl::Status> out =
      ForEachItem(table_, items, [&](ObjectTable::Shard& shard, size_t i) -> absl::Status {
        shard.mu.AssertHeld();
        bool recreated = false;
        absl::Status s = AddDiskReplica(shard, client_id, client ? &*client : nullptr, items[i],
                                        recovered, &recreated);
        if (recreated) {
          max_generation = std::max(max_generation, items[i].generation);
          ++created;
        }
        return s;
      });
  // Generations stay unique: never issue one a recovered record already carries.
  if (max_generation > 0) puts_.generations().RaisePast(max_generation);
  if (created > 0) {
    Logger("master").info("client {} recovered {} object(s) from its SSD tier", client_id, created);
  }
  return out;
}

absl::Status TieringService::AddDiskReplica(ObjectTable::Shard& shard, const std::string& client_id,
                                            const ClientInfo* client, const DiskReplicaItem& item,
                                            bool recovered, bool* created) {
  if (client == nullptr || client->disk_capacity == 0) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("client '", client_id, "' is unknown or has no SSD tier"));
  }
  if (item.length == 0 || item.length > options_.max_object_size) {
    return McError(Code::kInvalidArgument, absl::StrCat("bad length ", item.length));
  }
  if (absl::Status g = puts_.generations().CheckReported(item.generation); !g.ok()) {
    // Adopting it would push the next generation towards the limit (or wrap it to 0, which
    // means "never reserved"), and every later put would fail: refuse the record instead.
    if (recovered) disk_reports_refused_.Inc();
    MC_LOG_EVERY(std::chrono::seconds(5), Logger("master"), err,
                 "client {}: disk record of a key of {} bytes has generation {}, which no "
                 "master issued; refused",
                 client_id, item.key.size(), item.generation);
    return g;
  }
  Replica replica{ReplicaTier::kDisk,
                  MemoryLocation{client_id, client->endpoint, 0, item.locator, item.length}};
  auto it = shard.objects.find(AsKey(item.key));
  if (it == shard.objects.end()) {
    if (recovered && offload_queue_.HasPendingDrop(client_id, item.key, item.generation)) {
      return McError(Code::kNotFound, "removed: the record is to be deleted");
    }
    if (!recovered) {
      return McError(Code::kNotFound, "object gone (removed or evicted) before offload");
    }
    Object object;
    object.size = item.length;
    object.checksum = item.checksum;
    object.generation = item.generation;
    object.state = ObjectState::kComplete;
    object.replicas.push_back(StoredReplica::Of(replica));
    shard.Insert(item.key, std::move(object));
    *created = true;
    return absl::OkStatus();
  }
  const Object& object = it->second;
  absl::Status out;
  // A report about a key the master knows never changes that object: a record of another
  // generation, length or checksum is refused (counted when recovered: the record is stale
  // or forged; the known object is kept).
  if (object.generation != item.generation || object.state != ObjectState::kComplete) {
    out = McError(Code::kNotFound, "superseded by another generation of the key");
    if (recovered) disk_reports_refused_.Inc();
  } else if (object.size != item.length || object.checksum != item.checksum) {
    out = McError(Code::kInvalidArgument, "record length or checksum differ from the object");
    if (recovered) disk_reports_refused_.Inc();
  } else if (!object.HasDiskReplicaOn(client_id)) {
    shard.AddReplica(object, StoredReplica::Of(replica));
  }
  // Persisted now: the queued task is over and an earlier failure no longer matters.
  if (!recovered) shard.ClearOffloadMarks(object);
  return out;
}

void TieringService::MarkOffloadsFailed(const std::string& client_id,
                                        const std::vector<DiskReplicaItem>& failed) {
  int64_t now = clock_.NowMs();
  size_t marked = 0;
  ForEachItem(table_, failed, [&](ObjectTable::Shard& shard, size_t i) -> absl::Status {
    shard.mu.AssertHeld();
    auto it = shard.objects.find(AsKey(failed[i].key));
    if (it == shard.objects.end() || it->second.generation != failed[i].generation) {
      return absl::OkStatus();
    }
    shard.MarkOffloadFailed(it->second, now);
    ++marked;
    return absl::OkStatus();
  });
  offload_failures_.Inc(failed.size());
  MC_LOG_EVERY(std::chrono::seconds(5), Logger("master"), warn,
               "client {} could not persist {} object(s) on its SSD tier: they may now leave "
               "memory unpersisted",
               client_id, marked);
}

std::vector<absl::Status> TieringService::RemoveDiskReplicas(
    const std::string& client_id, const std::vector<DiskReplicaItem>& items, bool corrupt) {
  std::vector<MemoryLocation> to_free;
  int64_t now = clock_.NowMs();
  std::vector<absl::Status> out =
      ForEachItem(table_, items, [&](ObjectTable::Shard& shard, size_t i) -> absl::Status {
        shard.mu.AssertHeld();
        auto it = shard.objects.find(AsKey(items[i].key));
        if (it == shard.objects.end() || it->second.generation != items[i].generation) {
          return absl::OkStatus();  // nothing refers to that record any more: it may go
        }
        if (!corrupt && shard.HasLiveLease(it->second, now)) {
          return McError(Code::kHasLease, "a reader holds a lease on this object");
        }
        const size_t dropped = shard.RemoveReplicas(it->second, [&](const StoredReplica& r) {
          return r.tier == ReplicaTier::kDisk && r.client_id() == client_id;
        });
        if (corrupt && dropped > 0) {
          corrupt_records_.Inc();
          corrupt_disk_replicas_.Inc();
          Logger("master").error(
              "client {} found its SSD record of {} (generation {}) corrupt: "
              "replica dropped",
              client_id, KeyForLog(items[i].key), items[i].generation);
        }
        if (it->second.replicas.empty()) {
          // The tier reclaims its coldest records only when it is full: the last copy goes.
          (corrupt ? corrupt_lost_ : disk_reclaimed_lost_).Inc();
          puts_.DropPromotion(shard, it->second, &to_free);
          shard.Erase(it);
        }
        return absl::OkStatus();
      });
  for (const MemoryLocation& loc : to_free) segments_.Free(loc);
  return out;
}

absl::StatusOr<std::vector<OffloadTask>> TieringService::TakeOffloadTasks(
    const std::string& client_id, uint64_t session, size_t max) {
  std::optional<ClientInfo> info = clients_.Get(client_id);
  if (!info || info->session != session) {
    return McError(Code::kNotFound, absl::StrCat("unknown client session ", client_id));
  }
  return offload_queue_.Take(client_id, max);
}

void TieringService::KickPlanner() {
  // At most one extra pass per millisecond, whatever the number of waiting puts.
  int64_t now = clock_.NowMs();
  int64_t last = last_kick_ms_.load();
  if (now == last || !last_kick_ms_.compare_exchange_strong(last, now)) return;
  planner_.Plan();
}

void TieringService::RunMaintenance() {
  planner_.Plan();
  evictor_.EvictToWatermark();
}

}  // namespace mc::master
