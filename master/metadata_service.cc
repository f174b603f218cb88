// Client lifecycle, the put lifecycle and maintenance. Lookups, leases, removal and DISK
// replicas are in metadata_service_read.cc.
#include "master/metadata_service.h"

#include <algorithm>
#include <chrono>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/auth.h"
#include "common/checked_math.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/util.h"

namespace mc::master {
namespace {

spdlog::logger& Log() {
  static spdlog::logger& log = Logger("master");
  return log;
}

}  // namespace

MetadataService::MetadataService(MasterOptions options, const Clock& clock,
                                 MetricsRegistry& metrics)
    : tables_(std::move(options), clock, metrics),
      options_(tables_.options),
      epoch_(tables_.epoch),
      clock_(tables_.clock),
      table_(tables_.table),
      segments_(tables_.segments),
      clients_(tables_.clients),
      evictor_(tables_.evictor),
      offload_queue_(tables_.offload_queue),
      planner_(tables_.planner),
      membership_mu_(tables_.membership_mu),
      puts_(tables_, disputed_, [this] { tiering_.KickPlanner(); }),
      reads_(tables_, puts_),
      tiering_(tables_, puts_),
      reports_(tables_, puts_, disputed_),
      lifecycle_(tables_, puts_, reports_),
      corrupt_lost_(metrics.GetCounter(
          "mc_objects_lost_total",
          "Acknowledged objects dropped with their last copy, by reason (every tier that could "
          "hold them was full, failing or absent)",
          {{"reason", "corrupt"}})),
      corrupt_memory_replicas_(metrics.GetCounter(
          "mc_replicas_dropped_total",
          "Replicas dropped because they failed verification when read, by tier and reason",
          {{"tier", "memory"}, {"reason", "corrupt"}})),
      fault_reports_refused_(metrics.GetCounter(
          "mc_master_fault_reports_refused_total",
          "Replica fault reports not acted on: no lease held on the object, or the holder still "
          "heartbeats")) {
  metrics
      .GetGauge("mc_master_epoch",
                "This master run's epoch (the high 32 bits of every segment id it assigns)")
      .Set(epoch_);
  Log().info("master epoch {:08x} (segment ids {:08x}00000001 and up)", epoch_, epoch_);
}

std::vector<PutStartOutcome> MetadataService::PutStart(const std::string& client_id,
                                                       const std::vector<PutStartItem>& items,
                                                       uint32_t replicas,
                                                       const std::vector<std::string>& avoid) {
  return puts_.PutStart(client_id, items, replicas, avoid);
}

std::vector<absl::Status> MetadataService::PutEnd(const std::string& client_id,
                                                  const std::vector<PutEndItem>& items) {
  return puts_.PutEnd(client_id, items);
}

std::vector<absl::Status> MetadataService::PutRevoke(const std::string& client_id,
                                                     const std::vector<PutRevokeItem>& items) {
  return puts_.PutRevoke(client_id, items);
}

void MetadataService::RunMaintenance() {
  lifecycle_.ExpireClients();
  reports_.ReleaseTimedOutReports();
  puts_.RevokeTimedOutPuts();
  reads_.SweepLeases();
  FreeDeferred();
  tiering_.RunMaintenance();
}

size_t MetadataService::KeyCount() {
  size_t n = 0;
  table_.ForEachShard([&](ObjectTable::Shard& shard) {
    shard.mu.AssertHeld();
    n += shard.objects.size();
  });
  return n;
}

size_t MetadataService::TransientCountForTest() {
  size_t n = 0;
  table_.ForEachShard([&](ObjectTable::Shard& shard) {
    shard.mu.AssertHeld();
    for (auto it = shard.objects.begin(); it != shard.objects.end(); ++it) {
      n += it->second.has_transient() ? 1 : 0;
    }
  });
  return n;
}

MasterSnapshot MetadataService::Snapshot() {
  MasterSnapshot snap;
  SegmentStats seg = segments_.Stats();
  snap.mem_used = seg.used;
  snap.mem_capacity = seg.capacity;
  snap.keys = KeyCount();
  snap.clients = clients_.Count();
  snap.disk_used = clients_.DiskUsed();
  snap.disk_capacity = clients_.DiskCapacity();
  snap.eviction = evictor_.Stats();
  snap.lost_ssd_reclaimed = tiering_.LostSsdReclaimed();
  return snap;
}

std::string MetadataService::StatusLine() {
  MasterSnapshot s = Snapshot();
  double pct = s.mem_capacity == 0 ? 0.0 : 100.0 * s.mem_used / s.mem_capacity;
  return absl::StrFormat(
      "Mem Storage: %s / %s (%.1f%%) | Keys: %d | Clients: %d | Eviction: "
      "Success/Attempts=%d/%d | SSD Storage: %s / %s | Lost: %d (evicted unpersisted %d, SSD "
      "reclaimed %d) | Epoch: %08x",
      FormatBytes(s.mem_used), FormatBytes(s.mem_capacity), pct, s.keys, s.clients,
      s.eviction.successes, s.eviction.attempts, FormatBytes(s.disk_used),
      FormatBytes(s.disk_capacity), s.eviction.evicted_unpersisted + s.lost_ssd_reclaimed,
      s.eviction.evicted_unpersisted, s.lost_ssd_reclaimed, epoch_);
}

}  // namespace mc::master
