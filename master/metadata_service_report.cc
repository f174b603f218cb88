// Restart and return: owners report the objects their memory segments hold, and the master
// rebuilds them (ReportObjects); held segments are released at the report's end or timeout.
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "master/metadata_service.h"

namespace mc::master {
namespace {

spdlog::logger& Log() {
  static spdlog::logger& log = Logger("master");
  return log;
}

}  // namespace

absl::Status MetadataService::ValidateReported(const ReportedObjectItem& item) const {
  absl::Status s = ValidateKey(item.key);
  if (!s.ok()) return s;
  if (item.size == 0 || item.size > options_.max_object_size) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("size ", item.size, " outside 1..", options_.max_object_size));
  }
  return puts_.generations().CheckReported(item.generation);
}

absl::Status MetadataService::ApplyReported(ObjectTable::Shard& shard, const std::string& client_id,
                                            const ReportedObjectItem& item,
                                            const MemoryLocation& location, bool* restored,
                                            std::vector<MemoryLocation>* to_free) {
  auto it = shard.objects.find(AsKey(item.key));
  if (it == shard.objects.end()) {
    // Removed while this client was away, with its SSD record still to be deleted.
    if (offload_queue_.HasPendingDrop(client_id, item.key, item.generation)) {
      return McError(Code::kNotFound, "superseded: the key was removed");
    }
    if (disputed_.Contains(item.key)) {
      return McError(Code::kChecksumMismatch,
                     "owners reported conflicting versions of this key: it is not restored");
    }
    Object object;
    object.size = item.size;
    object.checksum = item.checksum;
    object.generation = item.generation;
    object.state = ObjectState::kComplete;
    object.replicas.push_back(StoredReplica::Of(ReplicaTier::kMemory, location));
    shard.Insert(item.key, std::move(object));
    *restored = true;
    return absl::OkStatus();
  }
  const Object& object = it->second;
  const bool differs = object.generation != item.generation || object.size != item.size ||
                       object.checksum != item.checksum;
  // An object only reported (no writer: no put of this run vouches for it) against a report
  // that differs: the master cannot tell which owner holds the bytes that were written, and a
  // member may have reported (or had an owner record) its own bytes under this key. Neither
  // wins: the object and all its replicas go, and the key stays disputed.
  if (differs && object.writer == 0 && object.state == ObjectState::kComplete) {
    Log().warn(
        "conflicting reports of {}: generation {} size {} checksum {:#x} (known, reported) "
        "against generation {} size {} checksum {:#x} from client {}; the key is dropped",
        KeyForLog(item.key), object.generation, object.size, object.checksum, item.generation,
        item.size, item.checksum, client_id);
    puts_.DropPromotion(shard, object, to_free);
    for (const StoredReplica& r : object.replicas) {
      if (r.tier == ReplicaTier::kMemory) {
        to_free->push_back(r.location());
      } else {  // the owning client deletes the record
        offload_queue_.Push(
            r.client_id(),
            OffloadTask{OffloadTask::Kind::kDrop, std::string(it->first), object.generation,
                        object.size, object.checksum, 0, 0, r.offset});
      }
    }
    shard.Erase(it);
    disputed_.Add(item.key);
    reported_conflicts_.Inc();
    return McError(Code::kChecksumMismatch,
                   "owners reported conflicting versions of this key: it is dropped");
  }
  // A known object of this run wins: a report never changes its generation, size or checksum.
  if (object.generation != item.generation || object.state != ObjectState::kComplete) {
    return McError(Code::kNotFound,
                   "superseded: the key is stored under another generation or being put");
  }
  if (object.size != item.size || object.checksum != item.checksum) {
    return McError(Code::kInvalidArgument,
                   "size or checksum differ from the known object of this generation");
  }
  for (const StoredReplica& r : object.replicas) {
    if (r.tier == ReplicaTier::kMemory && r.client_id() == client_id) {
      return McError(Code::kNotFound, "superseded: this client already holds a replica of it");
    }
  }
  shard.AddReplica(object, StoredReplica::Of(ReplicaTier::kMemory, location));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<absl::Status>> MetadataService::ReportObjects(
    const std::string& client_id, uint64_t session, const std::vector<ReportedObjectItem>& items,
    bool last) {
  // Registrations wait for the report: the session checked here stays current until it ends,
  // and so do the segments it names.
  absl::ReaderMutexLock membership(&membership_mu_);
  std::optional<ClientInfo> info = clients_.Get(client_id);
  if (!info || info->session != session) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", session, " is not the current registration of client '", client_id,
                     "': a report belongs to the registration it follows"));
  }
  std::vector<absl::Status> out(items.size());
  // Pass 1, in request order: check each item and reserve exactly its range.
  std::vector<MemoryLocation> ranges;
  std::vector<size_t> item_of;  // ranges[j] is items[item_of[j]]'s
  uint64_t max_generation = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    out[i] = ValidateReported(items[i]);
    if (!out[i].ok()) continue;
    max_generation = std::max(max_generation, items[i].generation);
    ranges.push_back(MemoryLocation{
        {}, {}, items[i].segment_id, items[i].offset, items[i].size, items[i].generation});
    item_of.push_back(i);
  }
  constexpr size_t kNone = SIZE_MAX;
  std::vector<size_t> range_of(items.size(), kNone);
  std::vector<absl::Status> reserved = segments_.AllocateAt(client_id, ranges);
  for (size_t j = 0; j < ranges.size(); ++j) {
    if (reserved[j].ok()) {
      range_of[item_of[j]] = j;
    } else {
      out[item_of[j]] = std::move(reserved[j]);
    }
  }
  // Generations stay unique: never issue one a reported object carries (raised before the
  // objects appear, so no put started meanwhile takes one of theirs).
  if (max_generation > 0) puts_.generations().RaisePast(max_generation);
  // Pass 2, shard by shard: restore or join; a refused item's range goes back.
  std::vector<std::string_view> keys;
  keys.reserve(items.size());
  for (const auto& item : items) keys.push_back(item.key);
  uint64_t restored = 0;
  uint64_t joined = 0;
  std::vector<MemoryLocation> to_free;
  table_.ForKeys(keys, [&](ObjectTable::Shard& shard, const std::vector<size_t>& indices) {
    shard.mu.AssertHeld();
    for (size_t i : indices) {
      if (range_of[i] == kNone) continue;
      bool created = false;
      out[i] = ApplyReported(shard, client_id, items[i], ranges[range_of[i]], &created, &to_free);
      if (!out[i].ok()) {
        to_free.push_back(ranges[range_of[i]]);
      } else {
        ++(created ? restored : joined);
      }
    }
  });
  for (const MemoryLocation& loc : to_free) segments_.Free(loc);
  const uint64_t refused = items.size() - restored - joined;
  reported_restored_.Inc(restored);
  reported_joined_.Inc(joined);
  reported_refused_.Inc(refused);

  std::optional<ReportState> ended;
  {
    absl::MutexLock lock(&report_mu_);
    auto it = reports_.find(client_id);
    if (it != reports_.end() && it->second.session == session) {
      ReportState& state = it->second;
      state.reported += items.size();
      state.restored += restored;
      state.joined += joined;
      state.refused += refused;
      if (last) {
        ended = state;
        reports_.erase(it);
      }
    }
  }
  if (last) {
    segments_.Release(client_id);
    if (ended) {
      Log().info(
          "client {} reported {} object(s): restored {}, joined {}, refused {}; its segments "
          "were held for {} ms",
          client_id, ended->reported, ended->restored, ended->joined, ended->refused,
          clock_.NowMs() - ended->start_ms);
    } else {
      Log().info(
          "client {} ended an object report ({} in its last chunk: restored {}, joined "
          "{}, refused {}) after its segments were released",
          client_id, items.size(), restored, joined, refused);
    }
  }
  return out;
}

void MetadataService::ReleaseTimedOutReports() {
  // Under the membership lock: a registration cannot replace a client between the timeout
  // check and the release (which would open the new registration's held segments).
  absl::ReaderMutexLock membership(&membership_mu_);
  const int64_t now = clock_.NowMs();
  std::vector<std::pair<std::string, ReportState>> expired;
  {
    absl::MutexLock lock(&report_mu_);
    for (auto it = reports_.begin(); it != reports_.end();) {
      if (now - it->second.start_ms >= options_.object_report_timeout_ms) {
        expired.emplace_back(it->first, it->second);
        reports_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (const auto& [client_id, state] : expired) {
    segments_.Release(client_id);
    reports_timed_out_.Inc();
    Log().warn(
        "client {} did not end its object report within {} ms ({} reported so far: restored {}, "
        "joined {}, refused {}); its segments take new placements again",
        client_id, options_.object_report_timeout_ms, state.reported, state.restored, state.joined,
        state.refused);
  }
}

}  // namespace mc::master
