// ReadService: reads and their leases. GetReplicas looks keys up (whole batches or a prefix
// match) and grants a read lease on what it finds, ReleaseLeases ends them (only for the owner
// that was granted them), Exist probes, Remove drops stored objects no reader holds a lease on
// (their DISK records are queued for deletion by their owners), and RunMaintenance (SweepLeases)
// ends expired leases. A lease keeps an object's replicas where they are until it ends
// (invariant 3: no range is reused under a live lease). Every batched call answers one result
// per input item, in order. Thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "master/master_tables.h"
#include "master/put_coordinator.h"

namespace mc::master {

class ReadService {
 public:
  ReadService(MasterTables& tables, PutCoordinator& puts);

  LookupBatch GetReplicas(const std::vector<std::string_view>& keys, const LookupOptions& options);
  // Ends lease `lease_id` on `keys` where `owner` granted it (LookupOptions::lease_owner); a
  // lease of another owner stays and is counted (mc_master_lease_releases_refused_total).
  size_t ReleaseLeases(uint64_t lease_id, const std::vector<std::string_view>& keys,
                       uint64_t owner = 0);
  std::vector<bool> Exist(const std::vector<std::string_view>& keys);
  std::vector<absl::Status> Remove(const std::vector<std::string_view>& keys);

  // Maintenance: ends the leases past their expiry.
  void SweepLeases();
  // Live read leases over all objects (a scan of the leased keys only).
  size_t ActiveLeaseCount();

 private:
  // Keys a prefix match looks up per step (it stops after the step that finds the first miss).
  static constexpr size_t kPrefixChunk = 128;
  // GetReplicas' steps: the input checks, the lookups (returns how many keys were looked up),
  // and the end of a prefix match (drops the keys past the first miss, releasing their leases).
  static void CheckLookupKeys(const std::vector<std::string_view>& keys, LookupBatch* batch);
  size_t LookUp(const std::vector<std::string_view>& keys, const LookupOptions& options,
                int64_t ttl, LookupBatch* batch);
  void EndPrefix(const std::vector<std::string_view>& keys, const LookupOptions& options,
                 size_t looked_up, LookupBatch* batch);

  const MasterOptions& options_;
  const Clock& clock_;
  ObjectTable& table_;
  SegmentManager& segments_;
  OffloadQueue& offload_queue_;
  PutCoordinator& puts_;
  Counter& leases_granted_;
  Counter& leases_expired_;
  Counter& leases_released_;
  Counter& lease_releases_refused_;
};

}  // namespace mc::master
