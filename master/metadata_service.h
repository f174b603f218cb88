// MetadataService: the master's domain API, free of gRPC.
//
// Wires the components (ObjectTable, SegmentManager, ClientRegistry, Evictor, PendingPuts) into
// the operations of the Master service: client registration and liveness, the put lifecycle
// (PutStart -> PutEnd | PutRevoke | timeout), lookups that grant read leases, removal, the DISK
// replicas of the SSD tier, and periodic maintenance. Policy lives in the components; this class
// sequences them and keeps the lock order (shard -> segments; never two shards at once).
// Every batched call answers one result per input item, in order, and validates its input: bad
// input is a per-key error and changes nothing.
// Restart and return: each run has a random epoch, the high 32 bits of every segment id it
// assigns. A client that registers with will_report_objects has its segments held (no new
// placement) until it has reported the objects they hold (ReportObjects, last=true) or
// object_report_timeout_ms passes; the master rebuilds those objects from the report. Every
// memory range the master frees is queued for its owner and handed out with its heartbeats, so
// the owner's index forgets it (SegmentManager's forget queue).
// Thread-safe.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/keys.h"
#include "common/metrics.h"
#include "master/client_lifecycle.h"
#include "master/client_registry.h"
#include "master/disputed_keys.h"
#include "master/evictor.h"
#include "master/generation_counter.h"
#include "master/master_tables.h"
#include "master/master_types.h"
#include "master/object_reports.h"
#include "master/object_table.h"
#include "master/offload_planner.h"
#include "master/put_coordinator.h"
#include "master/read_service.h"
#include "master/segment_manager.h"
#include "master/tiering_service.h"

namespace mc::master {

class MetadataService {
 public:
  MetadataService(MasterOptions options, const Clock& clock, MetricsRegistry& metrics);

  // Clients: see ClientLifecycle.
  absl::StatusOr<Registration> RegisterClient(const ClientInfo& info,
                                              const std::vector<uint64_t>& segment_sizes,
                                              const RegistrationAuth& auth = {},
                                              bool will_report_objects = false) {
    return lifecycle_.RegisterClient(info, segment_sizes, auth, will_report_objects);
  }
  // The session of `client_id` whose token is `token`, if it is live.
  std::optional<uint64_t> SessionOf(const std::string& client_id, std::string_view token) const {
    return lifecycle_.SessionOf(client_id, token);
  }
  bool Heartbeat(const std::string& client_id, uint64_t session, uint64_t disk_used,
                 std::vector<ReplicaRef>* forgotten = nullptr, bool* more_forgotten = nullptr) {
    return lifecycle_.Heartbeat(client_id, session, disk_used, forgotten, more_forgotten);
  }
  absl::Status UnregisterClient(const std::string& client_id, uint64_t session) {
    return lifecycle_.UnregisterClient(client_id, session);
  }

  // Puts.
  // `avoid`: clients not to place on (holders that refused the writer moments ago).
  std::vector<PutStartOutcome> PutStart(const std::string& client_id,
                                        const std::vector<PutStartItem>& items, uint32_t replicas,
                                        const std::vector<std::string>& avoid = {});
  std::vector<absl::Status> PutEnd(const std::string& client_id,
                                   const std::vector<PutEndItem>& items);
  std::vector<absl::Status> PutRevoke(const std::string& client_id,
                                      const std::vector<PutRevokeItem>& items);

  // Reads.
  LookupBatch GetReplicas(const std::vector<std::string_view>& keys, const LookupOptions& options) {
    return reads_.GetReplicas(keys, options);
  }
  // Ends lease `lease_id` on `keys` where `owner` granted it (LookupOptions::lease_owner); a
  // lease of another owner stays and is counted (mc_master_lease_releases_refused_total).
  size_t ReleaseLeases(uint64_t lease_id, const std::vector<std::string_view>& keys,
                       uint64_t owner = 0) {
    return reads_.ReleaseLeases(lease_id, keys, owner);
  }
  std::vector<bool> Exist(const std::vector<std::string_view>& keys) { return reads_.Exist(keys); }
  std::vector<absl::Status> Remove(const std::vector<std::string_view>& keys) {
    return reads_.Remove(keys);
  }

  // The SSD tier. `recovered`: records found at the client's start, which may recreate objects
  // the master does not know; otherwise the object must exist with the item's generation.
  // `failed`: OFFLOAD tasks the client could not persist (only key and generation are read);
  // those objects may leave memory unpersisted for a while (counted as lost when they do).
  std::vector<absl::Status> AddDiskReplicas(const std::string& client_id,
                                            const std::vector<DiskReplicaItem>& items,
                                            bool recovered,
                                            const std::vector<DiskReplicaItem>& failed = {}) {
    return tiering_.AddDiskReplicas(client_id, items, recovered, failed);
  }
  // HAS_LEASE for an object a reader holds a lease on (its record must stay).
  // `corrupt`: the records failed verification; they go whatever the leases (counted).
  std::vector<absl::Status> RemoveDiskReplicas(const std::string& client_id,
                                               const std::vector<DiskReplicaItem>& items,
                                               bool corrupt = false) {
    return tiering_.RemoveDiskReplicas(client_id, items, corrupt);
  }
  // Promotion of SSD hits back to memory (see master.proto PromoteStart/PromoteEnd).
  std::vector<PutStartOutcome> PromoteStart(const std::string& client_id,
                                            const std::vector<PromoteItem>& items) {
    return puts_.PromoteStart(client_id, items);
  }
  std::vector<absl::Status> PromoteEnd(const std::string& client_id,
                                       const std::vector<PromoteItem>& items,
                                       const std::vector<bool>& written) {
    return puts_.PromoteEnd(client_id, items, written);
  }
  // Up to `max` queued OFFLOAD/DROP tasks for the client; kNotFound for an unknown session.
  absl::StatusOr<std::vector<OffloadTask>> TakeOffloadTasks(const std::string& client_id,
                                                            uint64_t session, size_t max) {
    return tiering_.TakeOffloadTasks(client_id, session, max);
  }

  // Restart and return: see ObjectReports.
  absl::StatusOr<std::vector<absl::Status>> ReportObjects(
      const std::string& client_id, uint64_t session, const std::vector<ReportedObjectItem>& items,
      bool last) {
    return reports_.ReportObjects(client_id, session, items, last);
  }

  // Self-repair (master.proto ReportReplicaFaults): `reporter` (whose session is
  // `reporter_session`, 0 without authentication) found a MEMORY replica corrupt, or a holder
  // unreachable. kCorrupt: accepted when the reporter holds a live lease on the object; the
  // replica leaves lookups now and its space is freed once every lease granted before has ended
  // (invariant 3); an object left without replicas is erased (counted lost, reason "corrupt").
  // kUnreachable: the holder is dropped as an expired client would be when the master can
  // confirm it is gone (ClientRegistry::TakeIfGone), otherwise FAILED_PRECONDITION.
  std::vector<absl::Status> ReportReplicaFaults(const std::string& reporter,
                                                uint64_t reporter_session,
                                                const std::vector<ReplicaFaultItem>& items);

  // Expires clients, releases held segments whose report timed out, revokes timed-out puts, sweeps
  // expired leases, evicts to the watermark.
  void RunMaintenance();

  MasterSnapshot Snapshot();
  // "Mem Storage: 1.00 GB / 2.00 GB (50.0%) | Keys: 3 | Clients: 2 | Eviction: ..." (one line).
  std::string StatusLine();
  std::vector<ClientInfo> Clients() const { return clients_.List(); }
  SegmentStats ClientSegmentStats(const std::string& id) const { return segments_.ClientStats(id); }
  const MasterOptions& options() const { return options_; }
  uint32_t epoch() const { return epoch_; }
  bool SegmentsHeldForTest(const std::string& client_id) const {
    return segments_.IsHeld(client_id);
  }
  size_t KeyCount();
  // Objects holding an Object::Transient record (a put, promotion, offload or lease in
  // progress, or leases not yet swept).
  size_t TransientCountForTest();
  // Live read leases over all objects (a scan of the leased keys only).
  size_t ActiveLeaseCount() { return reads_.ActiveLeaseCount(); }

 private:
  // ReportReplicaFaults' two kinds.
  absl::Status DropCorruptReplica(ObjectTable::Shard& shard, const ReplicaFaultItem& item,
                                  uint64_t reporter_session, int64_t now_ms)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  // Frees the ranges of dropped corrupt replicas whose last lease has ended.
  void FreeDeferred();

  MasterTables tables_;
  // Borrowed from tables_ (the use cases not yet moved to their own services).
  const MasterOptions& options_;
  const uint32_t epoch_;
  const Clock& clock_;
  ObjectTable& table_;
  SegmentManager& segments_;
  ClientRegistry& clients_;
  Evictor& evictor_;
  OffloadQueue& offload_queue_;
  OffloadPlanner& planner_;
  absl::Mutex& membership_mu_;
  DisputedKeys disputed_;
  PutCoordinator puts_;
  ReadService reads_;
  TieringService tiering_;
  ObjectReports reports_;
  ClientLifecycle lifecycle_;
  // Ranges of corrupt replicas dropped under leases: (free no earlier than, range). A leaf lock.
  absl::Mutex deferred_mu_;
  std::vector<std::pair<int64_t, MemoryLocation>> deferred_frees_ ABSL_GUARDED_BY(deferred_mu_);
  Counter& corrupt_lost_;
  Counter& corrupt_memory_replicas_;
  Counter& fault_reports_refused_;
};

}  // namespace mc::master
