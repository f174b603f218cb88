// TieringService: the SSD tier as the master sees it, and memory's way down to it.
//   AddDiskReplicas records the DISK replicas clients persisted (OFFLOAD tasks done) or
//   recovered at their start, and the offloads they could not persist; RemoveDiskReplicas drops
//   records a tier reclaimed or found corrupt; TakeOffloadTasks hands a client its queued
//   OFFLOAD/DROP tasks. RunMaintenance plans offloads and evicts memory to its watermark;
//   KickPlanner runs a planning pass at once (rate-limited) for puts that wait for write-backs.
// Every batched call answers one result per input item, in order. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "master/master_tables.h"
#include "master/put_coordinator.h"

namespace mc::master {

class TieringService {
 public:
  TieringService(MasterTables& tables, PutCoordinator& puts);

  // `recovered`: records found at the client's start, which may recreate objects the master
  // does not know; otherwise the object must exist with the item's generation.
  // `failed`: OFFLOAD tasks the client could not persist (only key and generation are read);
  // those objects may leave memory unpersisted for a while (counted as lost when they do).
  std::vector<absl::Status> AddDiskReplicas(const std::string& client_id,
                                            const std::vector<DiskReplicaItem>& items,
                                            bool recovered,
                                            const std::vector<DiskReplicaItem>& failed = {});
  // HAS_LEASE for an object a reader holds a lease on (its record must stay).
  // `corrupt`: the records failed verification; they go whatever the leases (counted).
  std::vector<absl::Status> RemoveDiskReplicas(const std::string& client_id,
                                               const std::vector<DiskReplicaItem>& items,
                                               bool corrupt = false);
  // Up to `max` queued OFFLOAD/DROP tasks for the client; kNotFound for an unknown session.
  absl::StatusOr<std::vector<OffloadTask>> TakeOffloadTasks(const std::string& client_id,
                                                            uint64_t session, size_t max);

  // An offload planning pass now (at most one per millisecond): puts wait for write-back.
  void KickPlanner();
  // Maintenance: an offload planning pass, then eviction to the watermark.
  void RunMaintenance();
  // Objects whose last copy, on SSD, its tier reclaimed.
  uint64_t LostSsdReclaimed() const { return disk_reclaimed_lost_.Value(); }

 private:
  // AddDiskReplicas for one item, with its shard locked; `*created`: a recovered record
  // recreated the object.
  absl::Status AddDiskReplica(ObjectTable::Shard& shard, const std::string& client_id,
                              const ClientInfo* client, const DiskReplicaItem& item, bool recovered,
                              bool* created) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  void MarkOffloadsFailed(const std::string& client_id, const std::vector<DiskReplicaItem>& failed);

  const MasterOptions& options_;
  const Clock& clock_;
  ObjectTable& table_;
  SegmentManager& segments_;
  ClientRegistry& clients_;
  OffloadQueue& offload_queue_;
  Evictor& evictor_;
  OffloadPlanner& planner_;
  PutCoordinator& puts_;
  std::atomic<int64_t> last_kick_ms_{std::numeric_limits<int64_t>::min()};
  Counter& disk_reclaimed_lost_;
  Counter& offload_failures_;
  Counter& corrupt_records_;
  Counter& corrupt_lost_;
  Counter& disk_reports_refused_;
  Counter& corrupt_disk_replicas_;
};

}  // namespace mc::master
