// ReplicaRepair: self-repair from readers' reports (master.proto ReportReplicaFaults). A reader
// that found a MEMORY replica corrupt (kCorrupt) has it dropped, when it holds a live lease on
// the object; the replica leaves lookups now and its space is freed once every lease granted
// before has ended (invariant 3; RunMaintenance: FreeDeferred). An object left without replicas
// is erased (counted lost, reason "corrupt"). A holder reported unreachable (kUnreachable) is
// dropped by ClientLifecycle::DropUnreachable when the master can confirm it is gone.
// Thread-safe; deferred_mu_ is a leaf lock.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "master/client_lifecycle.h"
#include "master/master_tables.h"

namespace mc::master {

class ReplicaRepair {
 public:
  ReplicaRepair(MasterTables& tables, ClientLifecycle& lifecycle);

  // `reporter` (whose session is `reporter_session`, 0 without authentication) found a MEMORY
  // replica corrupt, or a holder unreachable. kCorrupt: accepted when the reporter holds a live
  // lease on the object. kUnreachable: the holder is dropped as an expired client would be when
  // the master can confirm it is gone (ClientRegistry::TakeIfGone), otherwise
  // FAILED_PRECONDITION. One status per item, in order.
  std::vector<absl::Status> ReportReplicaFaults(const std::string& reporter,
                                                uint64_t reporter_session,
                                                const std::vector<ReplicaFaultItem>& items);

  // Maintenance: frees the ranges of dropped corrupt replicas whose last lease has ended.
  void FreeDeferred();

 private:
  absl::Status DropCorruptReplica(ObjectTable::Shard& shard, const ReplicaFaultItem& item,
                                  uint64_t reporter_session, int64_t now_ms)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);

  const Clock& clock_;
  ObjectTable& table_;
  SegmentManager& segments_;
  ClientLifecycle& lifecycle_;
  // Ranges of corrupt replicas dropped under leases: (free no earlier than, range). A leaf lock.
  absl::Mutex deferred_mu_;
  std::vector<std::pair<int64_t, MemoryLocation>> deferred_frees_ ABSL_GUARDED_BY(deferred_mu_);
  Counter& corrupt_memory_replicas_;
  Counter& corrupt_lost_;
  Counter& fault_reports_refused_;
};

}  // namespace mc::master
