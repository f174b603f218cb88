#include "master/master_status_page.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_page.h"
#include "common/util.h"

namespace mc::master {
namespace {

std::string UsedOf(uint64_t used, uint64_t capacity) {
  if (capacity == 0) return absl::StrCat(FormatBytes(used), " / ", FormatBytes(capacity));
  return absl::StrFormat("%s / %s (%.1f%%)", FormatBytes(used), FormatBytes(capacity),
                         100.0 * static_cast<double>(used) / static_cast<double>(capacity));
}

}  // namespace

std::string MasterStatusHtml(MetadataService& service, const LeaderElection* election,
                             const MetricsRegistry& metrics, const Clock& clock) {
  StatusPage page;
  page.title = "mc-master";
  page.status_line = service.StatusLine();
  if (election != nullptr) page.status_line += " " + election->StatusLine();
  const MasterSnapshot snap = service.Snapshot();

  StatusPage::Section cluster{"Cluster", {}};
  cluster.rows.push_back(
      {"Role", election != nullptr ? election->StatusLine() : "leader (single master)"});
  cluster.rows.push_back({"Epoch", absl::StrFormat("%08x", service.epoch())});
  cluster.rows.push_back({"Clients alive", absl::StrCat(snap.clients)});
  cluster.rows.push_back({"Keys", absl::StrCat(snap.keys)});
  cluster.rows.push_back({"Read leases active", absl::StrCat(service.ActiveLeaseCount())});
  const MetadataService::LeaseRecords leases = service.LeaseRecordCounts();
  cluster.rows.push_back(
      {"Lease records (objects / grants)", absl::StrCat(leases.objects, " / ", leases.grants)});
  page.sections.push_back(std::move(cluster));

  StatusPage::Section capacity{"Capacity per tier", {}};
  capacity.rows.push_back({"Memory", UsedOf(snap.mem_used, snap.mem_capacity)});
  capacity.rows.push_back({"SSD", UsedOf(snap.disk_used, snap.disk_capacity)});
  capacity.rows.push_back(
      {"Puts answered NO_SPACE", MetricValue(metrics, "mc_put_no_space_total")});
  page.sections.push_back(std::move(capacity));

  StatusPage::Section eviction{"Evictions", {}};
  eviction.rows.push_back({"Passes", MetricValue(metrics, "mc_eviction_attempts_total")});
  eviction.rows.push_back({"Succeeded", MetricValue(metrics, "mc_eviction_successes_total")});
  const std::string failed = MetricValue(metrics, "mc_eviction_failures_total");
  eviction.rows.push_back({"Failed", failed, failed != "0"});
  eviction.rows.push_back({"Keys evicted", MetricValue(metrics, "mc_evicted_keys_total")});
  eviction.rows.push_back(
      {"Bytes evicted", FormatBytes(static_cast<uint64_t>(metrics.Sum("mc_evicted_bytes_total")))});
  AddMetricBreakdown(eviction, metrics, "Skipped", "mc_eviction_skipped_total", "reason", false);
  page.sections.push_back(std::move(eviction));

  StatusPage::Section integrity{"Lost and corrupt", {}};
  AddMetricBreakdown(integrity, metrics, "Objects lost", "mc_objects_lost_total", "reason", true);
  const std::string corrupt = MetricValue(metrics, "mc_disk_replicas_corrupt_total");
  integrity.rows.push_back({"SSD replicas failing their checksum", corrupt, corrupt != "0"});
  page.sections.push_back(std::move(integrity));

  StatusPage::Section auth{"Refused callers", {}};
  AddMetricBreakdown(auth, metrics, "Auth failures", "mc_master_auth_failures_total", "reason",
                     true);
  const std::string refused = MetricValue(metrics, "mc_master_registrations_refused_total");
  auth.rows.push_back({"Registrations refused", refused, refused != "0"});
  page.sections.push_back(std::move(auth));

  StatusPage::Table clients{"Clients",
                            {"client id", "host", "data endpoint", "segments", "memory used",
                             "SSD used", "last heartbeat"},
                            {},
                            0};
  std::vector<ClientInfo> list = service.Clients();
  std::sort(list.begin(), list.end(),
            [](const ClientInfo& a, const ClientInfo& b) { return a.client_id < b.client_id; });
  const int64_t now = clock.NowMs();
  for (const ClientInfo& c : list) {
    if (clients.rows.size() >= kMaxClientRows) {
      ++clients.omitted;
      continue;
    }
    const SegmentStats seg = service.ClientSegmentStats(c.client_id);
    clients.rows.push_back(
        {c.client_id, c.host, c.endpoint, absl::StrCat(seg.segments),
         UsedOf(seg.used, seg.capacity), UsedOf(c.disk_used, c.disk_capacity),
         absl::StrCat(std::max<int64_t>(now - c.last_heartbeat_ms, 0), " ms ago")});
  }
  page.tables.push_back(std::move(clients));
  return RenderStatusPageHtml(page);
}

}  // namespace mc::master
