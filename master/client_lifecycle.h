// ClientLifecycle: the clients' membership. RegisterClient admits a client and its memory
// segments (re-registering an id drops everything its previous session owned), Heartbeat keeps
// it alive and hands it the ranges freed in its segments, UnregisterClient lets it go, and
// RunMaintenance (ExpireClients) drops the clients silent past client_ttl_ms. Dropping a client
// (CleanupClient) removes its segments, its replicas, its pending puts and promotions, its
// offload tasks, its report in progress, and the objects left without a replica.
// Membership changes are serialized by MasterTables::membership_mu, so a client that
// re-registers while its expiry is being cleaned up never loses its new segments.
// Thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/checked_math.h"
#include "master/master_tables.h"
#include "master/object_reports.h"
#include "master/put_coordinator.h"

namespace mc::master {

class ClientLifecycle {
 public:
  ClientLifecycle(MasterTables& tables, PutCoordinator& puts, ObjectReports& reports);

  // Re-registering an id drops everything its previous session owned. With `auth.bound`, a live
  // session of the id is replaced only under the takeover rule
  // (MasterOptions::client_takeover_after_ms); otherwise UNAVAILABLE, counted.
  // `will_report_objects`: the client's segments are held until its report ends
  // (ReportObjects) or MasterOptions::object_report_timeout_ms passes.
  absl::StatusOr<Registration> RegisterClient(const ClientInfo& info,
                                              const std::vector<uint64_t>& segment_sizes,
                                              const RegistrationAuth& auth = {},
                                              bool will_report_objects = false);
  // The session of `client_id` whose token is `token`, if it is live.
  std::optional<uint64_t> SessionOf(const std::string& client_id, std::string_view token) const {
    return clients_.SessionOf(client_id, token);
  }
  // False for an unknown session. Otherwise also hands out (when `forgotten` is set) up to
  // MasterOptions::forget_batch of the ranges freed in the client's segments; `*more_forgotten`:
  // more remain queued.
  bool Heartbeat(const std::string& client_id, uint64_t session, uint64_t disk_used,
                 std::vector<ReplicaRef>* forgotten = nullptr, bool* more_forgotten = nullptr);
  absl::Status UnregisterClient(const std::string& client_id, uint64_t session);
  // A reader found `holder` unreachable (ReplicaRepair): it is dropped as an expired client
  // would be when the master can confirm it is gone (ClientRegistry::TakeIfGone: silent for two
  // and a half heartbeat intervals, or replaced), otherwise NOT_READY.
  absl::Status DropUnreachable(const std::string& reporter, const std::string& holder);

  // Maintenance: drops the clients that missed their heartbeats for client_ttl_ms.
  void ExpireClients();

 private:
  // RegisterClient's checks: the input (segments, disk figures, endpoint), whose segment sizes
  // add up in `*capacity`; the takeover rule against the `live` session of the id; room in
  // PeerNames for the client's names.
  absl::Status CheckRegistration(const ClientInfo& info, const std::vector<uint64_t>& segment_sizes,
                                 CheckedSum* capacity) const;
  absl::Status CheckTakeover(const ClientInfo& info, const RegistrationAuth& auth,
                             const std::optional<ClientInfo>& live);
  absl::Status InternPeerNames(const ClientInfo& info);
  // Drops every segment, replica, pending put and replica-less object of a client. Under
  // membership_mu_.
  void CleanupClient(const std::string& client_id);

  const MasterOptions& options_;
  const uint32_t epoch_;
  const Clock& clock_;
  ObjectTable& table_;
  SegmentManager& segments_;
  ClientRegistry& clients_;
  OffloadQueue& offload_queue_;
  absl::Mutex& membership_mu_;
  PutCoordinator& puts_;
  ObjectReports& reports_;
  Counter& clients_expired_;
  Counter& registrations_refused_;
  Counter& unreachable_dropped_;
};

}  // namespace mc::master
