#include "client/client_status_page.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_page.h"
#include "common/util.h"

namespace mc::client {
namespace {

const Labels kGets = {{"rpc", "BatchGet"}};
const Labels kPuts = {{"rpc", "BatchPut"}};

double Items(const MetricsRegistry& metrics, const Labels& rpc, const char* code) {
  Labels match = rpc;
  match.emplace_back("code", code);
  return metrics.Sum("mc_client_items_total", match);
}

std::string Count(double v) { return absl::StrFormat("%.0f", v); }

}  // namespace

std::string ClientStatusHtml(const std::string& status_line, const MetricsRegistry& metrics) {
  StatusPage page;
  page.title = "mc-client";
  page.status_line = status_line;
  page.sections.push_back({"This client", StatusLineRows(status_line)});

  StatusPage::Section capacity{"Capacity per tier", {}};
  capacity.rows.push_back(
      {"Memory objects indexed", MetricValue(metrics, "mc_client_index_objects")});
  if (!metrics.Values("mc_ssd_capacity_bytes").empty()) {
    const double used = metrics.Sum("mc_ssd_used_bytes");
    const double cap = metrics.Sum("mc_ssd_capacity_bytes");
    capacity.rows.push_back(
        {"SSD", absl::StrFormat("%s / %s (%.1f%%)", FormatBytes(static_cast<uint64_t>(used)),
                                FormatBytes(static_cast<uint64_t>(cap)),
                                cap > 0 ? 100.0 * used / cap : 0.0)});
    capacity.rows.push_back(
        {"SSD records reclaimed", MetricValue(metrics, "mc_ssd_evictions_total")});
  } else {
    capacity.rows.push_back({"SSD", "off"});
  }
  page.sections.push_back(std::move(capacity));

  StatusPage::Section gets{"Gets and puts (items)", {}};
  const double get_all = metrics.Sum("mc_client_items_total", kGets);
  const double hits = Items(metrics, kGets, "OK");
  const double misses = Items(metrics, kGets, "NOT_FOUND");
  gets.rows.push_back({"Get hits", Count(hits)});
  gets.rows.push_back({"Get misses (NOT_FOUND)", Count(misses)});
  gets.rows.push_back(
      {"Get failures (other codes)", Count(get_all - hits - misses), get_all - hits - misses > 0});
  gets.rows.push_back(
      {"Hit ratio", get_all > 0 ? absl::StrFormat("%.1f%%", 100.0 * hits / get_all) : "-"});
  const double put_all = metrics.Sum("mc_client_items_total", kPuts);
  const double put_ok = Items(metrics, kPuts, "OK");
  const double put_exists = Items(metrics, kPuts, "ALREADY_EXISTS");
  gets.rows.push_back({"Puts stored", Count(put_ok)});
  gets.rows.push_back({"Puts of stored keys (ALREADY_EXISTS)", Count(put_exists)});
  gets.rows.push_back(
      {"Puts failed", Count(put_all - put_ok - put_exists), put_all - put_ok - put_exists > 0});
  gets.rows.push_back(
      {"Bytes in / out",
       absl::StrCat(FormatBytes(static_cast<uint64_t>(metrics.Sum("mc_client_bytes_in_total"))),
                    " / ",
                    FormatBytes(static_cast<uint64_t>(metrics.Sum("mc_client_bytes_out_total"))))});
  page.sections.push_back(std::move(gets));

  StatusPage::Section integrity{"Checksum mismatches", {}};
  const std::string mismatches = MetricValue(metrics, "mc_client_checksum_mismatches_total");
  integrity.rows.push_back({"Gets with every replica corrupt", mismatches, mismatches != "0"});
  const std::string ssd = MetricValue(metrics, "mc_ssd_checksum_mismatches_total");
  integrity.rows.push_back({"SSD records failing their checksum", ssd, ssd != "0"});
  const std::string dropped = MetricValue(metrics, "mc_client_disk_corrupt_dropped_total");
  integrity.rows.push_back({"Corrupt SSD records dropped", dropped, dropped != "0"});
  page.sections.push_back(std::move(integrity));

  StatusPage::Section auth{"Refused callers", {}};
  AddMetricBreakdown(auth, metrics, "Data-plane handshakes", "mc_data_auth_failures_total",
                     "reason", true);
  AddMetricBreakdown(auth, metrics, "Data-plane capabilities", "mc_data_capability_denied_total",
                     "reason", true);
  AddMetricBreakdown(auth, metrics, "Store tokens", "mc_store_auth_failures_total", "reason", true);
  const std::string owner = MetricValue(metrics, "mc_store_buffer_owner_mismatches_total");
  auth.rows.push_back({"Buffers of another session", owner, owner != "0"});
  page.sections.push_back(std::move(auth));
  return RenderStatusPageHtml(page);
}

}  // namespace mc::client
