// Self-repair from readers' reports (master.proto ReportReplicaFaults).
#include "master/replica_repair.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "master/master_metrics.h"

namespace mc::master {

namespace {
spdlog::logger& Log() { return Logger("master"); }
}  // namespace

ReplicaRepair::ReplicaRepair(MasterTables& tables, ClientLifecycle& lifecycle)
    : clock_(tables.clock),
      table_(tables.table),
      segments_(tables.segments),
      lifecycle_(lifecycle),
      corrupt_memory_replicas_(ReplicasDroppedCounter(tables.metrics, "memory", "corrupt")),
      corrupt_lost_(ObjectsLostCounter(tables.metrics, "corrupt")),
      fault_reports_refused_(tables.metrics.GetCounter(
          "mc_master_fault_reports_refused_total",
          "Replica fault reports not acted on: no lease held on the object, or the holder still "
          "heartbeats")) {}

std::vector<absl::Status> ReplicaRepair::ReportReplicaFaults(
    const std::string& reporter, uint64_t reporter_session,
    const std::vector<ReplicaFaultItem>& items) {
  std::vector<absl::Status> out(items.size());
  std::vector<ReplicaFaultItem> corrupt;
  std::vector<size_t> corrupt_index;
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].fault == ReplicaFault::kUnreachable) {
      out[i] = lifecycle_.DropUnreachable(reporter, items[i].holder);
    } else {
      corrupt.push_back(items[i]);
      corrupt_index.push_back(i);
    }
  }
  const int64_t now = clock_.NowMs();
  std::vector<absl::Status> dropped =
      ForEachItem(table_, corrupt, [&](ObjectTable::Shard& shard, size_t i) {
        shard.mu.AssertHeld();
        return DropCorruptReplica(shard, corrupt[i], reporter_session, now);
      });
  for (size_t k = 0; k < corrupt.size(); ++k) out[corrupt_index[k]] = std::move(dropped[k]);
  for (const absl::Status& s : out) {
    const Code code = ToCode(s);
    if (code == Code::kPermissionDenied || code == Code::kNotReady) fault_reports_refused_.Inc();
  }
  return out;
}

absl::Status ReplicaRepair::DropCorruptReplica(ObjectTable::Shard& shard,
                                               const ReplicaFaultItem& item,
                                               uint64_t reporter_session, int64_t now_ms) {
  auto it = shard.objects.find(AsKey(item.key));
  if (it == shard.objects.end() || it->second.generation != item.generation ||
      it->second.state != ObjectState::kComplete) {
    return McError(Code::kNotFound, "no complete object of this generation");
  }
  const Object& object = it->second;
  // Only a reader that has just read the object may condemn a replica of it: its lease proves
  // it looked the key up. Without authentication every lease has owner 0.
  int64_t last_expiry = 0;
  bool reporter_leased = false;
  for (const Lease& lease : shard.LeasesOf(object)) {
    if (lease.expiry_ms <= now_ms) continue;
    last_expiry = std::max(last_expiry, lease.expiry_ms);
    reporter_leased |= lease.owner == reporter_session;
  }
  if (!reporter_leased) {
    return McError(Code::kPermissionDenied,
                   "the reporter holds no live lease on this object (report right after the "
                   "read that found it bad)");
  }
  std::vector<MemoryLocation> freed;
  const size_t removed = shard.RemoveReplicas(object, [&](const StoredReplica& r) {
    const bool match = r.tier == ReplicaTier::kMemory && r.segment_id == item.segment_id &&
                       r.offset == item.offset && r.client_id() == item.holder;
    if (match) freed.push_back(r.location());
    return match;
  });
  if (removed == 0) return McError(Code::kNotFound, "no such memory replica of this object");
  corrupt_memory_replicas_.Inc();
  Log().error("replica of {} (generation {}) on client {} failed its checksum when read: dropped",
              KeyForLog(item.key), item.generation, item.holder);
  if (object.replicas.empty()) {
    // Its last copy was bad: the key is free to be stored again by whoever computes it.
    corrupt_lost_.Inc();
    shard.Erase(it);
  }
  {
    // Readers that looked the object up before hold leases on the range until they end: its
    // space is reused only after the last of them (invariant 3).
    absl::MutexLock lock(&deferred_mu_);
    for (MemoryLocation& loc : freed) deferred_frees_.emplace_back(last_expiry, std::move(loc));
  }
  return absl::OkStatus();
}

void ReplicaRepair::FreeDeferred() {
  const int64_t now = clock_.NowMs();
  std::vector<MemoryLocation> due;
  {
    absl::MutexLock lock(&deferred_mu_);
    auto keep = std::partition(deferred_frees_.begin(), deferred_frees_.end(),
                               [&](const auto& entry) { return entry.first > now; });
    for (auto it = keep; it != deferred_frees_.end(); ++it) due.push_back(std::move(it->second));
    deferred_frees_.erase(keep, deferred_frees_.end());
  }
  for (const MemoryLocation& loc : due) segments_.Free(loc);
}

}  // namespace mc::master
