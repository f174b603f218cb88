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
      if (absl::Status g = CheckReportedGeneration(item.generation); !g.ok()) {
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
  uint64_t next = next_generation_.load();
  while (max_generation >= next &&
         !next_generation_.compare_exchange_weak(next, max_generation + 1)) {
  }
  if (created > 0) {
    Logger("master").info("client {} recovered {} object(s) from its SSD tier", client_id, created);
  }
  return out;
}

void MetadataService::MarkOffloadsFailed(const std::string& client_id,
                                         const std::vector<DiskReplicaItem>& failed) {
  int64_t now = clock_.NowMs();
  size_t marked = 0;
  ForEachItem(failed, [&](ObjectTable::Shard& shard, size_t i) -> absl::Status {
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
      ForEachItem(items, [&](ObjectTable::Shard& shard, size_t i) -> absl::Status {
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
          DropPromotion(shard, it->second, &to_free);
          shard.Erase(it);
        }
        return absl::OkStatus();
      });
  for (const MemoryLocation& loc : to_free) segments_.Free(loc);
  return out;
}

std::vector<PutStartOutcome> MetadataService::PromoteStart(
    const std::string& client_id, const std::vector<PutRevokeItem>& items) {
  std::vector<PutStartOutcome> out(items.size());
  std::vector<std::string_view> keys;
  for (const auto& item : items) keys.push_back(item.key);
  bool known_client = clients_.IsAlive(client_id);
  int64_t now = clock_.NowMs();
  std::vector<uint64_t> sizes(items.size(), 0);
  // Phase 1: reserve the promotion on objects that are COMPLETE and have no memory replica.
  table_.ForKeys(keys, [&](ObjectTable::Shard& shard, const std::vector<size_t>& indices) {
    shard.mu.AssertHeld();
    for (size_t i : indices) {
      absl::Status& s = out[i].status;
      s = ValidateKey(items[i].key);
      if (!s.ok()) continue;
      if (!known_client) {
        s = UnknownClient(client_id);
        continue;
      }
      auto it = shard.objects.find(AsKey(items[i].key));
      if (it == shard.objects.end() || it->second.generation != items[i].generation ||
          it->second.state != ObjectState::kComplete) {
        s = McError(Code::kNotFound, "no complete object of this generation");
      } else if (it->second.HasMemoryReplica() || it->second.promotion()) {
        s = McError(Code::kAlreadyExists, "already in memory or being promoted");
      } else {
        shard.StartPromotion(it->second, Object::Promotion{{}, client_id, now});
        sizes[i] = it->second.size;
      }
    }
  });
  // Phase 2: place with no shard lock held.
  std::vector<MemoryLocation> placed(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (!out[i].status.ok()) continue;
    // Promotion is best effort: it may push out memory copies of objects that are also on SSD,
    // never the only copy of another object, neither by evicting (persisted objects only) nor
    // by filling memory past the high watermark, where the background pass would evict the
    // coldest objects whatever they are.
    absl::StatusOr<std::vector<MemoryLocation>> p =
        evictor_.MakeRoomUnderHighWatermark(sizes[i])
            ? PlaceWithEviction(sizes[i], 1, client_id, /*persisted_only=*/true)
            : McError(Code::kNoSpace, "promotion would fill memory past the high watermark");
    if (p.ok()) {
      placed[i] = (*p)[0];
    } else {
      out[i].status = p.status();
    }
  }
  // Phase 3: record the space on the reservation (or give it back).
  std::vector<MemoryLocation> to_free;
  table_.ForKeys(keys, [&](ObjectTable::Shard& shard, const std::vector<size_t>& indices) {
    shard.mu.AssertHeld();
    for (size_t i : indices) {
      if (sizes[i] == 0) continue;  // never reserved
      auto it = shard.objects.find(AsKey(items[i].key));
      const Object::Promotion* promotion =
          it != shard.objects.end() ? it->second.promotion() : nullptr;
      bool ours = promotion != nullptr && it->second.generation == items[i].generation &&
                  promotion->writer == client_id && promotion->start_ms == now &&
                  promotion->location.length == 0;
      if (!out[i].status.ok() || !ours) {
        if (ours) shard.EndPromotion(it->second);
        if (placed[i].length > 0) to_free.push_back(placed[i]);
        if (out[i].status.ok()) out[i].status = McError(Code::kNotFound, "object changed");
        continue;
      }
      placed[i].generation = items[i].generation;
      shard.PlacePromotion(it->second, placed[i]);
      pending_.Add(now + options_.put_timeout_ms, items[i].generation, std::string(it->first));
      out[i].generation = items[i].generation;
      out[i].replicas.push_back(Replica{ReplicaTier::kMemory, placed[i]});
    }
  });
  for (const MemoryLocation& loc : to_free) segments_.Free(loc);
  return out;
}

std::vector<absl::Status> MetadataService::PromoteEnd(const std::string& client_id,
                                                      const std::vector<PutRevokeItem>& items,
                                                      const std::vector<bool>& written) {
  std::vector<MemoryLocation> to_free;
  std::vector<absl::Status> out =
      ForEachItem(items, [&](ObjectTable::Shard& shard, size_t i) -> absl::Status {
        shard.mu.AssertHeld();
        auto it = shard.objects.find(AsKey(items[i].key));
        if (it == shard.objects.end() || it->second.generation != items[i].generation ||
            !it->second.promotion() || it->second.promotion()->writer != client_id ||
            it->second.promotion()->location.length == 0) {
          return McError(Code::kNotFound, "no promotion of this generation by this client");
        }
        const Object& object = it->second;
        if (i < written.size() && written[i]) {
          pending_.Remove(object.promotion()->start_ms + options_.put_timeout_ms,
                          object.generation);
          shard.CompletePromotion(object);
        } else {
          DropPromotion(shard, object, &to_free);
        }
        return absl::OkStatus();
      });
  for (const MemoryLocation& loc : to_free) segments_.Free(loc);
  return out;
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
