#include "master/master_tables.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace mc::master {
namespace {

// The run's epoch: `configured`, or random and nonzero (CSPRNG, like sessions: two runs share
// one with probability 2^-32).
uint32_t PickEpoch(uint32_t configured) {
  while (configured == 0) configured = static_cast<uint32_t>(ClientRegistry::NewSession());
  return configured;
}

}  // namespace

// A client the master does not know is most often transient: the master restarted and the
// client has not re-registered yet (it does within a heartbeat). UNAVAILABLE, with a hint.
absl::Status UnknownClient(const std::string& client_id) {
  return McError(Code::kUnavailable,
                 absl::StrCat("unknown client '", client_id,
                              "' (the master restarted or dropped it; retry after the client "
                              "re-registers, within a heartbeat interval)"));
}

MasterTables::MasterTables(MasterOptions options_in, const Clock& clock_in,
                           MetricsRegistry& metrics_in)
    : options(std::move(options_in)),
      epoch(PickEpoch(options.epoch)),
      clock(clock_in),
      metrics(metrics_in),
      table(options.shards),
      segments(SegmentManagerOptions{
          .alignment = options.alignment,
          .epoch = epoch,
          .forget_queue_limit = options.forget_queue_limit,
          .forget_dropped = &metrics.GetCounter(
              "mc_master_forget_dropped_total",
              "Freed ranges dropped from a client's forget queue past --forget_queue_limit (the "
              "owner's index keeps them, and a later report may restore them)"),
          .first_segment_counter = 1}),
      clients(clock, options.client_ttl_ms),
      evictor(
          table, segments, clock, metrics, options.eviction,
          [this](const std::string& id) { return DiskCapable(id); },
          options.offload.task_timeout_ms),
      planner(
          table, segments, offload_queue, [this](const std::string& id) { return DiskCapable(id); },
          clock, metrics, options.offload) {}

bool MasterTables::DiskCapable(const std::string& client_id) const {
  std::optional<ClientInfo> info = clients.Get(client_id);
  return info.has_value() && info->disk_capacity > 0;
}

}  // namespace mc::master
