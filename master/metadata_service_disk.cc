// DISK replicas: the records clients' SSD tiers persisted, dropped, or recovered at start.
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "master/metadata_service.h"

namespace mc::master {

std::vector<absl::Status> MetadataService::AddDiskReplicas(
    const std::string& client_id, const std::vector<DiskReplicaItem>& items, bool recovered,
    const std::vector<DiskReplicaItem>& failed) {
  if (!failed.empty()) MarkOffloadsFailed(client_id, failed);
  std::vector<absl::Status> out(items.size());
  std::optional<ClientInfo> client = clients_.Get(client_id);
  std::vector<std::string_view> keys;
  for (const auto& item : items) keys.push_back(item.key);
  uint64_t max_generation = 0;
  size_t created = 0;
  table_.ForKeys(keys, [&](ObjectTable::Shard& shard, const std::vector<size_t>& indices) {
    shard.mu.AssertHeld();
    for (size_t i : indices) {
      const DiskReplicaItem& item = items[i];
      out[i] = ValidateKey(item.key);
      if (!out[i].ok()) continue;
      if (!client || client->disk_capacity == 0) {
        out[i] = McError(Code::kInvalidArgument,
                         absl::StrCat("client '", client_id, "' is unknown or has no SSD tier"));
        continue;
      }
      if (item.length == 0 || item.length > options_.max_object_size) {
        out[i] = McError(Code::kInvalidArgument, absl::StrCat("bad length ", item.length));
        continue;
      }
      if (absl::Status g = puts_.generations().CheckReported(item.generation); !g.ok()) {
        // Adopting it would push the next generation towards the limit (or wrap it to 0, which
        // means "never reserved"), and every later put would fail: refuse the record instead.
        out[i] = std::move(g);
        if (recovered) disk_reports_refused_.Inc();
        MC_LOG_EVERY(std::chrono::seconds(5), Logger("master"), err,
                     "client {}: disk record of a key of {} bytes has generation {}, which no "
                     "master issued; refused",
                     client_id, item.key.size(), item.generation);
        continue;
      }
      Replica replica{ReplicaTier::kDisk,
                      MemoryLocation{client_id, client->endpoint, 0, item.locator, item.length}};
      auto it = shard.objects.find(AsKey(item.key));
      if (it == shard.objects.end()) {
        if (recovered && offload_queue_.HasPendingDrop(client_id, item.key, item.generation)) {
          out[i] = McError(Code::kNotFound, "removed: the record is to be deleted");
          continue;
        }
        if (!recovered) {
          out[i] = McError(Code::kNotFound, "object gone (removed or evicted) before offload");
          continue;
        }
        Object object;
        object.size = item.length;
        object.checksum = item.checksum;
        object.generation = item.generation;
        object.state = ObjectState::kComplete;
        object.replicas.push_back(StoredReplica::Of(replica));
        shard.Insert(item.key, std::move(object));
        max_generation = std::max(max_generation, item.generation);
        ++created;
        continue;
      }
      const Object& object = it->second;
      // A report about a key the master knows never changes that object: a record of another
      // generation, length or checksum is refused (counted when recovered: the record is stale
      // or forged; the known object is kept).
      if (object.generation != item.generation || object.state != ObjectState::kComplete) {
        out[i] = McError(Code::kNotFound, "superseded by another generation of the key");
        if (recovered) disk_reports_refused_.Inc();
      } else if (object.size != item.length || object.checksum != item.checksum) {
        out[i] =
            McError(Code::kInvalidArgument, "record length or checksum differ from the object");
        if (recovered) disk_reports_refused_.Inc();
      } else if (!object.HasDiskReplicaOn(client_id)) {
        shard.AddReplica(object, StoredReplica::Of(replica));
      }
      // Persisted now: the queued task is over and an earlier failure no longer matters.
      if (!recovered) shard.ClearOffloadMarks(object);
    }
  });
  // Generations stay unique: never issue one a recovered record already carries.
  if (max_generation > 0) puts_.generations().RaisePast(max_generation);
  if (created > 0) {
    Logger("master").info("client {} recovered {} object(s) from its SSD tier", client_id, created);
  }
  return out;
}

void MetadataService::MarkOffloadsFailed(const std::string& client_id,
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

std::vector<absl::Status> MetadataService::RemoveDiskReplicas(
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
        if (!corrupt && it->second.HasLiveLease(now)) {
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

std::vector<PutStartOutcome> MetadataService::PromoteStart(const std::string& client_id,
                                                           const std::vector<PromoteItem>& items) {
  return puts_.PromoteStart(client_id, items);
}

std::vector<absl::Status> MetadataService::PromoteEnd(const std::string& client_id,
                                                      const std::vector<PromoteItem>& items,
                                                      const std::vector<bool>& written) {
  return puts_.PromoteEnd(client_id, items, written);
}

absl::StatusOr<std::vector<OffloadTask>> MetadataService::TakeOffloadTasks(
    const std::string& client_id, uint64_t session, size_t max) {
  std::optional<ClientInfo> info = clients_.Get(client_id);
  if (!info || info->session != session) {
    return McError(Code::kNotFound, absl::StrCat("unknown client session ", client_id));
  }
  return offload_queue_.Take(client_id, max);
}

}  // namespace mc::master
