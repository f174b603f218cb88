// MasterApi: the master's domain interface, the calls its gRPC edge makes (master/grpc_service.cc
// maps each RPC's proto to these types and back; nothing below this interface sees protobuf).
// MetadataService implements it by forwarding each call to the use-case service that owns it
// (docs/architecture.md, "The master by use case"). Implementations are thread-safe; every
// batched call answers one result per input item, in order, and bad input is a per-key error
// that changes nothing. The contracts are those of the use-case services named below.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "master/master_types.h"

namespace mc::master {

class MasterApi {
 public:
  virtual ~MasterApi() = default;

  // Clients (ClientLifecycle).
  virtual absl::StatusOr<Registration> RegisterClient(const ClientInfo& info,
                                                      const std::vector<uint64_t>& segment_sizes,
                                                      const RegistrationAuth& auth,
                                                      bool will_report_objects) = 0;
  virtual bool Heartbeat(const std::string& client_id, uint64_t session, uint64_t disk_used,
                         std::vector<ReplicaRef>* forgotten, bool* more_forgotten) = 0;
  virtual absl::Status UnregisterClient(const std::string& client_id, uint64_t session) = 0;
  // The session of `client_id` whose token is `token`, if it is live (authentication).
  virtual std::optional<uint64_t> SessionOf(const std::string& client_id,
                                            std::string_view token) const = 0;

  // Puts and promotions (PutCoordinator).
  virtual std::vector<PutStartOutcome> PutStart(const std::string& client_id,
                                                const std::vector<PutStartItem>& items,
                                                uint32_t replicas,
                                                const std::vector<std::string>& avoid) = 0;
  virtual std::vector<absl::Status> PutEnd(const std::string& client_id,
                                           const std::vector<PutEndItem>& items) = 0;
  virtual std::vector<absl::Status> PutRevoke(const std::string& client_id,
                                              const std::vector<PutRevokeItem>& items) = 0;
  virtual std::vector<PutStartOutcome> PromoteStart(const std::string& client_id,
                                                    const std::vector<PromoteItem>& items) = 0;
  virtual std::vector<absl::Status> PromoteEnd(const std::string& client_id,
                                               const std::vector<PromoteItem>& items,
                                               const std::vector<bool>& written) = 0;

  // Reads and leases (ReadService).
  virtual LookupBatch GetReplicas(const std::vector<std::string_view>& keys,
                                  const LookupOptions& options) = 0;
  virtual size_t ReleaseLeases(uint64_t lease_id, const std::vector<std::string_view>& keys,
                               uint64_t owner) = 0;
  virtual std::vector<bool> Exist(const std::vector<std::string_view>& keys) = 0;
  virtual std::vector<absl::Status> Remove(const std::vector<std::string_view>& keys) = 0;

  // The SSD tier (TieringService).
  virtual std::vector<absl::Status> AddDiskReplicas(const std::string& client_id,
                                                    const std::vector<DiskReplicaItem>& items,
                                                    bool recovered,
                                                    const std::vector<DiskReplicaItem>& failed) = 0;
  virtual std::vector<absl::Status> RemoveDiskReplicas(const std::string& client_id,
                                                       const std::vector<DiskReplicaItem>& items,
                                                       bool corrupt) = 0;
  virtual absl::StatusOr<std::vector<OffloadTask>> TakeOffloadTasks(const std::string& client_id,
                                                                    uint64_t session,
                                                                    size_t max) = 0;

  // Restart and return (ObjectReports), self-repair (ReplicaRepair).
  virtual absl::StatusOr<std::vector<absl::Status>> ReportObjects(
      const std::string& client_id, uint64_t session, const std::vector<ReportedObjectItem>& items,
      bool last) = 0;
  virtual std::vector<absl::Status> ReportReplicaFaults(
      const std::string& reporter, uint64_t reporter_session,
      const std::vector<ReplicaFaultItem>& items) = 0;

  // Status.
  virtual MasterSnapshot Snapshot() = 0;
  virtual std::string StatusLine() = 0;
  virtual std::vector<ClientInfo> Clients() const = 0;
  virtual SegmentStats ClientSegmentStats(const std::string& id) const = 0;
  virtual const MasterOptions& options() const = 0;
};

}  // namespace mc::master
