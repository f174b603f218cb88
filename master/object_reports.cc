// Restart and return: owners report the objects their memory segments hold, and the master
// rebuilds them (ReportObjects); held segments are released at the report's end or timeout.
#include "master/object_reports.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace mc::master {
namespace {

spdlog::logger& Log() {
  static spdlog::logger& log = Logger("master");
  return log;
}

// mc_master_objects_reported_total{result}.
Counter& ObjectsReportedCounter(MetricsRegistry& metrics, const char* result) {
  return metrics.GetCounter(
      "mc_master_objects_reported_total",
      "Objects clients reported holding (ReportObjects), by result: restored (the master "
      "knew no such key), joined (a replica added to the known object), refused",
      {{"result", result}});
}

}  // namespace

ObjectReports::ObjectReports(MasterTables& tables, PutCoordinator& puts, DisputedKeys& disputed)
    : options_(tables.options),
      clock_(tables.clock),
      table_(tables.table),
      segments_(tables.segments),
      clients_(tables.clients),
      offload_queue_(tables.offload_queue),
      membership_mu_(tables.membership_mu),
      puts_(puts),
      disputed_(disputed),
      reported_restored_(ObjectsReportedCounter(tables.metrics, "restored")),
      reported_joined_(ObjectsReportedCounter(tables.metrics, "joined")),
      reported_refused_(ObjectsReportedCounter(tables.metrics, "refused")),
      reported_conflicts_(tables.metrics.GetCounter(
          "mc_master_report_conflicts_total",
          "Reports (ReportObjects) that differed from another owner's report of the same key: "
          "the key was dropped and is refused to further reports (docs/security.md)")),
      reports_timed_out_(tables.metrics.GetCounter(
          "mc_master_object_reports_timed_out_total",
          "Object reports whose last chunk did not arrive within --object_report_timeout_ms "
          "(the client's segments were released for placement anyway)")) {}

absl::Status ObjectReports::ValidateReported(const ReportedObjectItem& item) const {
  absl::Status s = ValidateKey(item.key);
  if (!s.ok()) return s;
  if (item.size == 0 || item.size > options_.max_object_size) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("size ", item.size, " outside 1..", options_.max_object_size));
  }
  return puts_.generations().CheckReported(item.generation);
}

absl::Status ObjectReports::ApplyReported(ObjectTable::Shard& shard, const std::string& client_id,
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

absl::StatusOr<std::vector<absl::Status>> ObjectReports::ReportObjects(
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
  const ReservedRanges reserved = ReserveReported(client_id, items, &out);
  // Generations stay unique: never issue one a reported object carries (raised before the
  // objects appear, so no put started meanwhile takes one of theirs).
  if (reserved.max_generation > 0) puts_.generations().RaisePast(reserved.max_generation);
  uint64_t restored = 0;
  uint64_t joined = 0;
  ApplyAll(client_id, items, reserved, &out, &restored, &joined);
  const uint64_t refused = items.size() - restored - joined;
  reported_restored_.Inc(restored);
  reported_joined_.Inc(joined);
  reported_refused_.Inc(refused);
  EndChunk(client_id, session, items.size(), restored, joined, refused, last);
  return out;
}

ObjectReports::ReservedRanges ObjectReports::ReserveReported(
    const std::string& client_id, const std::vector<ReportedObjectItem>& items,
    std::vector<absl::Status>* out) {
  ReservedRanges reserved;
  std::vector<size_t> item_of;  // ranges[j] is items[item_of[j]]'s
  for (size_t i = 0; i < items.size(); ++i) {
    (*out)[i] = ValidateReported(items[i]);
    if (!(*out)[i].ok()) continue;
    reserved.max_generation = std::max(reserved.max_generation, items[i].generation);
    reserved.ranges.push_back(MemoryLocation{
        {}, {}, items[i].segment_id, items[i].offset, items[i].size, items[i].generation});
    item_of.push_back(i);
  }
  reserved.range_of.assign(items.size(), ReservedRanges::kNone);
  std::vector<absl::Status> allocated = segments_.AllocateAt(client_id, reserved.ranges);
  for (size_t j = 0; j < reserved.ranges.size(); ++j) {
    if (allocated[j].ok()) {
      reserved.range_of[item_of[j]] = j;
    } else {
      (*out)[item_of[j]] = std::move(allocated[j]);
    }
  }
  return reserved;
}

void ObjectReports::ApplyAll(const std::string& client_id,
                             const std::vector<ReportedObjectItem>& items,
                             const ReservedRanges& reserved, std::vector<absl::Status>* out_ptr,
                             uint64_t* restored, uint64_t* joined) {
  std::vector<absl::Status>& out = *out_ptr;
  std::vector<std::string_view> keys;
  keys.reserve(items.size());
  for (const auto& item : items) keys.push_back(item.key);
  std::vector<MemoryLocation> to_free;
  table_.ForKeys(keys, [&](ObjectTable::Shard& shard, const std::vector<size_t>& indices) {
    shard.mu.AssertHeld();
    for (size_t i : indices) {
      const size_t range = reserved.range_of[i];
      if (range == ReservedRanges::kNone) continue;
      bool created = false;
      out[i] =
          ApplyReported(shard, client_id, items[i], reserved.ranges[range], &created, &to_free);
      if (!out[i].ok()) {
        to_free.push_back(reserved.ranges[range]);
      } else {
        ++*(created ? restored : joined);
      }
    }
  });
  for (const MemoryLocation& loc : to_free) segments_.Free(loc);
}

void ObjectReports::EndChunk(const std::string& client_id, uint64_t session, size_t items,
                             uint64_t restored, uint64_t joined, uint64_t refused, bool last) {
  std::optional<ReportState> ended;
  {
    absl::MutexLock lock(&report_mu_);
    auto it = reports_.find(client_id);
    if (it != reports_.end() && it->second.session == session) {
      ReportState& state = it->second;
      state.reported += items;
      state.restored += restored;
      state.joined += joined;
      state.refused += refused;
      if (last) {
        ended = state;
        reports_.erase(it);
      }
    }
  }
  if (!last) return;
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
        client_id, items, restored, joined, refused);
  }
}

void ObjectReports::BeginReport(const std::string& client_id, uint64_t session) {
  absl::MutexLock lock(&report_mu_);
  reports_[client_id] = ReportState{.session = session, .start_ms = clock_.NowMs()};
}

void ObjectReports::DropReport(const std::string& client_id) {
  absl::MutexLock lock(&report_mu_);
  reports_.erase(client_id);
}

void ObjectReports::ReleaseTimedOutReports() {
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
