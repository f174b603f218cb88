#include "client/client_metrics.h"

namespace mc::client {
namespace {

// mc_client_prefix_lease_releases_total{by}.
Counter& LeaseReleasesCounter(MetricsRegistry& registry, const char* by) {
  return registry.GetCounter(
      "mc_client_prefix_lease_releases_total",
      "Prefix leases released, by who: the caller that took them (owner) or another caller "
      "presenting the lease's capability (token)",
      {{"by", by}});
}

// mc_client_get_speculative_total{outcome}.
Counter& SpeculativeCounter(MetricsRegistry& registry, const char* outcome) {
  return registry.GetCounter(
      "mc_client_get_speculative_total",
      "Get items of keys in this daemon's own segments copied while the master lookup was in "
      "flight, by outcome: kept (the answer named that replica and generation, leased, and the "
      "bytes matched its checksum), late (kept the same way, but the copy had not started when "
      "the answer came, so the get's own thread made it then, beside the helper), redone (read "
      "again from the answer), skipped (the copy helper was busy: read as usual)",
      {{"outcome", outcome}});
}

// mc_client_replica_faults_reported_total{fault}.
Counter& FaultsReportedCounter(MetricsRegistry& registry, const char* fault) {
  return registry.GetCounter("mc_client_replica_faults_reported_total",
                             "Replica faults this daemon reported to the master, by fault",
                             {{"fault", fault}});
}

}  // namespace

ClientMetrics::ClientMetrics(MetricsRegistry& registry)
    : bytes_in(registry.GetCounter("mc_client_bytes_in_total", "Payload bytes put")),
      bytes_out(registry.GetCounter("mc_client_bytes_out_total", "Payload bytes got")),
      duplicate_keys(registry.GetCounter("mc_client_duplicate_keys_total",
                                         "Get items served by fan-out from a duplicate key")),
      checksum_mismatches(registry.GetCounter("mc_client_checksum_mismatches_total",
                                              "Replicas whose bytes failed the checksum")),
      lease_expiries(registry.GetCounter("mc_client_lease_expiries_total",
                                         "Transfers that ended after their read lease")),
      replica_fallbacks(registry.GetCounter("mc_client_replica_fallbacks_total",
                                            "Reads retried on another replica")),
      put_no_space_retries(
          registry.GetCounter("mc_client_put_no_space_retries_total",
                              "Put items tried again after the master answered NO_SPACE")),
      put_write_back_waits(registry.GetCounter(
          "mc_client_put_write_back_waits_total",
          "Put items tried again because memory waits for write-back to an SSD tier")),
      put_index_failed(registry.GetCounter(
          "mc_client_put_index_failed_total",
          "Put items revoked (TRANSFER_FAILED) because no owner of their replicas recorded them "
          "in its object index, so a master restart would have forgotten them")),
      gpu_put_direct(registry.GetCounter(
          "mc_client_gpu_put_direct_total",
          "One-slice GPU put items sent straight from GPU memory to every replica (no host "
          "staging), whether their writes then succeed or fail")),
      gpu_put_direct_staged(registry.GetCounter(
          "mc_client_gpu_put_direct_staged_total",
          "One-slice GPU put items staged through host memory after all, because a replica "
          "could not be written from GPU memory (a peer over TCP, no GPUDirect RDMA)")),
      lease_releases_by_owner(LeaseReleasesCounter(registry, "owner")),
      lease_releases_by_token(LeaseReleasesCounter(registry, "token")),
      lease_release_refusals(registry.GetCounter(
          "mc_client_prefix_lease_release_refusals_total",
          "ReleaseLease calls refused: the lease was unknown, expired, or another caller's "
          "without its capability")),
      faults_reported_corrupt(FaultsReportedCounter(registry, "corrupt")),
      faults_reported_unreachable(FaultsReportedCounter(registry, "unreachable")),
      mismatches_unconfirmed(registry.GetCounter(
          "mc_client_checksum_mismatches_unconfirmed_total",
          "Checksum mismatches that a private re-read of the same replica did not confirm (the "
          "destination changed under the read): the replica is kept")),
      holder_backoff_skips(registry.GetCounter(
          "mc_client_holder_backoff_skips_total",
          "Replicas not tried because their holder refused a connection moments ago "
          "(--holder_backoff_ms)")),
      put_unreachable_retries(registry.GetCounter(
          "mc_client_put_unreachable_retries_total",
          "Put items placed again after a holder of their replicas refused the connection")),
      put_source_hashes(registry.GetCounter(
          "mc_client_put_source_hashes_total",
          "Put items hashed from their source in a pass of their own, because they have a "
          "replica in another daemon (whose write proves nothing); items whose replicas are all "
          "in this daemon's segments are hashed as they are copied")),
      get_speculative_kept(SpeculativeCounter(registry, "kept")),
      get_speculative_redone(SpeculativeCounter(registry, "redone")),
      get_speculative_late(SpeculativeCounter(registry, "late")),
      get_speculative_skipped(SpeculativeCounter(registry, "skipped")),
      registry_(registry) {}

ClientMetrics::Rpc& ClientMetrics::For(const char* rpc) {
  {
    absl::ReaderMutexLock lock(&rpcs_mu_);
    auto it = rpcs_.find(rpc);
    if (it != rpcs_.end()) return *it->second;
  }
  absl::MutexLock lock(&rpcs_mu_);
  auto& slot = rpcs_[rpc];
  if (!slot) {
    std::array<Counter*, kMaxCode + 1> items{};
    for (int c = 0; c <= kMaxCode; ++c) {
      items[c] = &registry_.GetCounter(
          "mc_client_items_total", "Store batch items answered, by RPC and code",
          {{"rpc", rpc}, {"code", std::string(CodeName(static_cast<Code>(c)))}});
    }
    slot = std::make_unique<Rpc>(Rpc{
        registry_.GetCounter("mc_client_rpc_requests_total", "Store RPCs received", {{"rpc", rpc}}),
        registry_.GetHistogram("mc_client_rpc_latency_seconds", "Store RPC latency",
                               {{"rpc", rpc}}),
        items});
  }
  return *slot;
}

}  // namespace mc::client
