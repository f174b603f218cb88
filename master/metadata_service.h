// MetadataService: the master's domain API (MasterApi), free of gRPC: a thin facade over the
// use-case services that share the master's tables (MasterTables):
//   ClientLifecycle  registration, heartbeats, unregistration, expiry and the cleanup of a
//                    dropped client;
//   PutCoordinator   the put lifecycle (PutStart -> PutEnd | PutRevoke | timeout), promotion of
//                    SSD hits back to memory, the pending puts and the generation counter;
//   ReadService      lookups that grant read leases, lease release and expiry, Exist, Remove;
//   TieringService   DISK replicas of the SSD tier, offload tasks, planning and eviction;
//   ObjectReports    restart and return: owners report the objects their segments hold;
//   ReplicaRepair    readers' reports of corrupt replicas and unreachable holders.
// Each call forwards to the service that owns it; RunMaintenance runs each service's own step.
// Policy lives in the components (ObjectTable, SegmentManager, ClientRegistry, Evictor,
// OffloadPlanner); the services sequence them and keep the lock order (membership -> shard ->
// segments; never two shards at once). Every batched call answers one result per input item,
// in order, and validates its input: bad input is a per-key error and changes nothing.
// Restart and return: each run has a random epoch, the high 32 bits of every segment id it
// assigns. Every memory range the master frees is queued for its owner and handed out with its
// heartbeats, so the owner's index forgets it (SegmentManager's forget queue).
// Thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "master/client_lifecycle.h"
#include "master/disputed_keys.h"
#include "master/generation_counter.h"
#include "master/master_api.h"
#include "master/master_tables.h"
#include "master/master_types.h"
#include "master/object_reports.h"
#include "master/put_coordinator.h"
#include "master/read_service.h"
#include "master/replica_repair.h"
#include "master/tiering_service.h"

namespace mc::master {

class MetadataService final : public MasterApi {
 public:
  MetadataService(MasterOptions options, const Clock& clock, MetricsRegistry& metrics);

  // Clients: see ClientLifecycle.
  absl::StatusOr<Registration> RegisterClient(const ClientInfo& info,
                                              const std::vector<uint64_t>& segment_sizes,
                                              const RegistrationAuth& auth = {},
                                              bool will_report_objects = false) override {
    return lifecycle_.RegisterClient(info, segment_sizes, auth, will_report_objects);
  }
  // The session of `client_id` whose token is `token`, if it is live.
  std::optional<uint64_t> SessionOf(const std::string& client_id,
                                    std::string_view token) const override {
    return lifecycle_.SessionOf(client_id, token);
  }
  bool Heartbeat(const std::string& client_id, uint64_t session, uint64_t disk_used,
                 std::vector<ReplicaRef>* forgotten = nullptr,
                 bool* more_forgotten = nullptr) override {
    return lifecycle_.Heartbeat(client_id, session, disk_used, forgotten, more_forgotten);
  }
  absl::Status UnregisterClient(const std::string& client_id, uint64_t session) override {
    return lifecycle_.UnregisterClient(client_id, session);
  }

  // Puts and promotions: see PutCoordinator.
  std::vector<PutStartOutcome> PutStart(const std::string& client_id,
                                        const std::vector<PutStartItem>& items, uint32_t replicas,
                                        const std::vector<std::string>& avoid = {}) override {
    return puts_.PutStart(client_id, items, replicas, avoid);
  }
  std::vector<absl::Status> PutEnd(const std::string& client_id,
                                   const std::vector<PutEndItem>& items) override {
    return puts_.PutEnd(client_id, items);
  }
  std::vector<absl::Status> PutRevoke(const std::string& client_id,
                                      const std::vector<PutRevokeItem>& items) override {
    return puts_.PutRevoke(client_id, items);
  }
  std::vector<PutStartOutcome> PromoteStart(const std::string& client_id,
                                            const std::vector<PromoteItem>& items) override {
    return puts_.PromoteStart(client_id, items);
  }
  std::vector<absl::Status> PromoteEnd(const std::string& client_id,
                                       const std::vector<PromoteItem>& items,
                                       const std::vector<bool>& written) override {
    return puts_.PromoteEnd(client_id, items, written);
  }

  // Reads and leases: see ReadService.
  LookupBatch GetReplicas(const std::vector<std::string_view>& keys,
                          const LookupOptions& options) override {
    return reads_.GetReplicas(keys, options);
  }
  size_t ReleaseLeases(uint64_t lease_id, const std::vector<std::string_view>& keys,
                       uint64_t owner = 0) override {
    return reads_.ReleaseLeases(lease_id, keys, owner);
  }
  std::vector<bool> Exist(const std::vector<std::string_view>& keys) override {
    return reads_.Exist(keys);
  }
  std::vector<absl::Status> Remove(const std::vector<std::string_view>& keys) override {
    return reads_.Remove(keys);
  }

  // The SSD tier: see TieringService.
  std::vector<absl::Status> AddDiskReplicas(
      const std::string& client_id, const std::vector<DiskReplicaItem>& items, bool recovered,
      const std::vector<DiskReplicaItem>& failed = {}) override {
    return tiering_.AddDiskReplicas(client_id, items, recovered, failed);
  }
  std::vector<absl::Status> RemoveDiskReplicas(const std::string& client_id,
                                               const std::vector<DiskReplicaItem>& items,
                                               bool corrupt = false) override {
    return tiering_.RemoveDiskReplicas(client_id, items, corrupt);
  }
  absl::StatusOr<std::vector<OffloadTask>> TakeOffloadTasks(const std::string& client_id,
                                                            uint64_t session, size_t max) override {
    return tiering_.TakeOffloadTasks(client_id, session, max);
  }

  // Restart and return: see ObjectReports. Self-repair: see ReplicaRepair.
  absl::StatusOr<std::vector<absl::Status>> ReportObjects(
      const std::string& client_id, uint64_t session, const std::vector<ReportedObjectItem>& items,
      bool last) override {
    return reports_.ReportObjects(client_id, session, items, last);
  }
  std::vector<absl::Status> ReportReplicaFaults(
      const std::string& reporter, uint64_t reporter_session,
      const std::vector<ReplicaFaultItem>& items) override {
    return repair_.ReportReplicaFaults(reporter, reporter_session, items);
  }

  // Expires clients, releases held segments whose report timed out, revokes timed-out puts,
  // sweeps expired leases, frees the space of dropped corrupt replicas, plans offloads and
  // evicts to the watermark: each service's own step, in this order.
  void RunMaintenance();

  MasterSnapshot Snapshot() override;
  // "Mem Storage: 1.00 GB / 2.00 GB (50.0%) | Keys: 3 | Clients: 2 | Eviction: ..." (one line).
  std::string StatusLine() override;
  std::vector<ClientInfo> Clients() const override { return tables_.clients.List(); }
  SegmentStats ClientSegmentStats(const std::string& id) const override {
    return tables_.segments.ClientStats(id);
  }
  const MasterOptions& options() const override { return tables_.options; }
  uint32_t epoch() const { return tables_.epoch; }
  bool SegmentsHeldForTest(const std::string& client_id) const {
    return tables_.segments.IsHeld(client_id);
  }
  size_t KeyCount();
  // Objects holding an Object::Transient record (a put, promotion or offload in progress).
  size_t TransientCountForTest();
  // What the shards keep for leases: objects with a lease entry (expired ones not yet swept
  // included), and grant records (ShardLeases). Both come back to 0 when no lease is held.
  struct LeaseRecords {
    size_t objects = 0;
    size_t grants = 0;
  };
  LeaseRecords LeaseRecordCounts();
  // Live read leases over all objects (a scan of the leased keys only).
  size_t ActiveLeaseCount() { return reads_.ActiveLeaseCount(); }

 private:
  // The shared state first, then the services in the order of their dependencies.
  MasterTables tables_;
  DisputedKeys disputed_;
  PutCoordinator puts_;
  ReadService reads_;
  TieringService tiering_;
  ObjectReports reports_;
  ClientLifecycle lifecycle_;
  ReplicaRepair repair_;
};

}  // namespace mc::master
