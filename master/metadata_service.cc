// The facade's own parts: wiring, maintenance and the status figures. The use cases live in
// their services (client_lifecycle.cc, put_coordinator.cc, read_service.cc,
// tiering_service.cc, object_reports.cc, replica_repair.cc).
#include "master/metadata_service.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/util.h"

namespace mc::master {

MetadataService::MetadataService(MasterOptions options, const Clock& clock,
                                 MetricsRegistry& metrics)
    : tables_(std::move(options), clock, metrics),
      puts_(tables_, disputed_, [this] { tiering_.KickPlanner(); }),
      reads_(tables_, puts_),
      tiering_(tables_, puts_),
      reports_(tables_, puts_, disputed_),
      lifecycle_(tables_, puts_, reports_),
      repair_(tables_, lifecycle_) {
  metrics
      .GetGauge("mc_master_epoch",
                "This master run's epoch (the high 32 bits of every segment id it assigns)")
      .Set(tables_.epoch);
  Logger("master").info("master epoch {:08x} (segment ids {:08x}00000001 and up)", tables_.epoch,
                        tables_.epoch);
}

void MetadataService::RunMaintenance() {
  lifecycle_.ExpireClients();
  reports_.ReleaseTimedOutReports();
  puts_.RevokeTimedOutPuts();
  reads_.SweepLeases();
  repair_.FreeDeferred();
  tiering_.RunMaintenance();
}

size_t MetadataService::KeyCount() {
  size_t n = 0;
  tables_.table.ForEachShard([&](ObjectTable::Shard& shard) {
    shard.mu.AssertHeld();
    n += shard.objects.size();
  });
  return n;
}

size_t MetadataService::TransientCountForTest() {
  size_t n = 0;
  tables_.table.ForEachShard([&](ObjectTable::Shard& shard) {
    shard.mu.AssertHeld();
    for (auto it = shard.objects.begin(); it != shard.objects.end(); ++it) {
      n += it->second.has_transient() ? 1 : 0;
    }
  });
  return n;
}

MetadataService::LeaseRecords MetadataService::LeaseRecordCounts() {
  LeaseRecords n;
  tables_.table.ForEachShard([&](ObjectTable::Shard& shard) {
    shard.mu.AssertHeld();
    n.objects += shard.leased().size();
    n.grants += shard.LeaseGrantCount();
  });
  return n;
}

MasterSnapshot MetadataService::Snapshot() {
  MasterSnapshot snap;
  SegmentStats seg = tables_.segments.Stats();
  snap.mem_used = seg.used;
  snap.mem_capacity = seg.capacity;
  snap.keys = KeyCount();
  snap.clients = tables_.clients.Count();
  snap.disk_used = tables_.clients.DiskUsed();
  snap.disk_capacity = tables_.clients.DiskCapacity();
  snap.eviction = tables_.evictor.Stats();
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
      s.eviction.evicted_unpersisted, s.lost_ssd_reclaimed, epoch());
}

}  // namespace mc::master
