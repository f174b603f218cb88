// The mc-client's own metrics, registered once and shared by its components.
#pragma once

#include <array>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "common/status.h"

namespace mc::client {

class ClientMetrics {
 public:
  explicit ClientMetrics(MetricsRegistry& registry);

  // The metrics of one Store RPC, looked up in the registry once (not per item).
  struct Rpc {
    Counter& requests;
    Histogram& latency;
    std::array<Counter*, kMaxCode + 1> items;  // per Code
    void CountItem(Code code) { items[static_cast<size_t>(code)]->Inc(); }
  };

  MetricsRegistry& registry() { return registry_; }
  Rpc& For(const char* rpc);

  Counter& bytes_in;        // payload bytes put by applications
  Counter& bytes_out;       // payload bytes handed to applications
  Counter& duplicate_keys;  // get items served from another item's transfer
  Counter& checksum_mismatches;
  Counter& lease_expiries;         // transfers that outlived their lease
  Counter& replica_fallbacks;      // a failed replica replaced by another
  Counter& put_no_space_retries;   // put items tried again after a NO_SPACE answer
  Counter& put_write_back_waits;   // put items tried again while memory waits for write-back
  Counter& put_index_failed;       // put items revoked because no owner recorded them
  Counter& gpu_put_direct;         // one-slice GPU put items sent from GPU memory
  Counter& gpu_put_direct_staged;  // ... staged after all (a replica the GPU cannot write)
  // Prefix leases (MatchPrefix) released by the caller that took them, or by another process
  // presenting the lease's capability; releases refused (unknown, expired or foreign).
  Counter& lease_releases_by_owner;
  Counter& lease_releases_by_token;
  Counter& lease_release_refusals;
  // Self-repair: faults reported to the master (corrupt replica, unreachable holder), checksum
  // mismatches that a private re-read did not confirm (the destination changed under the read),
  // replicas not tried because their holder refused connections moments ago (back-off).
  Counter& faults_reported_corrupt;
  Counter& faults_reported_unreachable;
  Counter& mismatches_unconfirmed;
  Counter& holder_backoff_skips;
  Counter& put_unreachable_retries;  // put items placed again after a holder refused them
  Counter& put_source_hashes;        // put items hashed apart from a copy: a remote replica
  // Speculative local copies (BatchGetter): kept (the answer confirmed them), redone (read again
  // from the answer), skipped (the helper was busy with another get's copies).
  Counter& get_speculative_kept;
  Counter& get_speculative_redone;
  Counter& get_speculative_late;  // kept, copied by the get's thread after the answer came
  Counter& get_speculative_skipped;

 private:
  MetricsRegistry& registry_;
  absl::Mutex rpcs_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Rpc>> rpcs_ ABSL_GUARDED_BY(rpcs_mu_);
};

}  // namespace mc::client
