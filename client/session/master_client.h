// MasterClient: how an mc-client daemon talks to mc-master. An interface (the seam tests replace
// with tests/fakes/fake_master_client.h, which runs the real master logic in-process) and its
// gRPC implementation. Every call is one RPC with a deadline; a transport failure comes back as
// kUnavailable. With cluster keys, the gRPC client authenticates (docs/security.md):
// RegisterClient carries a fresh proof of the cluster secret (and the current session's token,
// which proves a re-registration comes from the same daemon); it keeps the token the master
// answers and sends it with every later call. A call the master refuses for an unknown session
// (it restarted or dropped us) comes back as kUnavailable, and a Heartbeat so refused as
// known=false, so the session registers again as after any restart.
// Standby masters: the address may be a comma list of masters. The client keeps a
// channel per address and a current one; when a call answers UNAVAILABLE (no connection, or a
// standby's refusal naming the leader in trailing metadata x-mc-leader) or runs out of time,
// the current master moves to the leader named, else to the next address. The call is tried
// again within its deadline when it was certainly not executed (a standby's refusal, no
// connection) or is idempotent (GetReplicas, Exist, ReleaseLeases); otherwise it returns
// kUnavailable as before. The new leader does not know our session: the next Heartbeat answers
// known=false and the session registers again and reports its objects.
// The master lane (client/session/master_lane_client.h): when the registration answer names a
// lane port, GetReplicas, ReleaseLeases, PutStart, PutEnd, PutRevoke, Exist and Remove go over
// it, with the same credential and the same answers as over gRPC. A call the lane could not send
// (no connection, all busy) goes over gRPC at once; one whose answer was lost goes over gRPC when
// idempotent (GetReplicas, Exist, ReleaseLeases) and is kUnavailable otherwise, as gRPC's own
// retry rule has it; a master whose lane does not serve ReleaseLeases (older, UNIMPLEMENTED: not
// run) gets its releases over gRPC from then on; a standby's refusal drops the lane and goes the
// gRPC way (which follows the leader); the next registration brings the new master's lane.
// Thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/auth.h"
#include "common/metrics.h"
#include "mcstore/v1/master.grpc.pb.h"
#include "proto/grpc_tls.h"

namespace mc::client {

namespace v1 = mcstore::v1;

class MasterClient {
 public:
  virtual ~MasterClient() = default;
  virtual absl::Status RegisterClient(const v1::RegisterClientRequest& req,
                                      v1::RegisterClientResponse* resp) = 0;
  virtual absl::Status Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp) = 0;
  virtual absl::Status UnregisterClient(const v1::UnregisterClientRequest& req) = 0;
  virtual absl::Status PutStart(const v1::PutStartRequest& req, v1::PutStartResponse* resp) = 0;
  virtual absl::Status PutEnd(const v1::PutEndRequest& req, v1::PutEndResponse* resp) = 0;
  virtual absl::Status PutRevoke(const v1::PutRevokeRequest& req, v1::PutRevokeResponse* resp) = 0;
  virtual absl::Status GetReplicas(const v1::GetReplicasRequest& req,
                                   v1::GetReplicasResponse* resp) = 0;
  // `req` may name its keys packed: a client that may not send them packed (packing off, or an
  // older master met) names them one by one instead.
  virtual absl::Status ReleaseLeases(const v1::ReleaseLeasesRequest& req) = 0;
  // Releases leases without waiting for the answer; `done` gets the outcome later, maybe on
  // another thread (a lost release only keeps the keys leased until their TTL). The gRPC client
  // may hold a release back for a moment and pass it on with its next GetReplicas instead of
  // one RPC each. PutStart, Remove and ReleaseLeases of this client wait for the releases
  // queued before them, so this client's own writes, removals and explicit releases never leave
  // its finished reads holding leases. Default: synchronous.
  virtual void ReleaseLeasesAsync(v1::ReleaseLeasesRequest req,
                                  std::function<void(absl::Status)> done) {
    done(ReleaseLeases(req));
  }
  virtual absl::Status Exist(const v1::ExistRequest& req, v1::ExistResponse* resp) = 0;
  virtual absl::Status Remove(const v1::RemoveRequest& req, v1::RemoveResponse* resp) = 0;
  virtual absl::Status AddDiskReplicas(const v1::AddDiskReplicasRequest& req,
                                       v1::AddDiskReplicasResponse* resp) = 0;
  virtual absl::Status RemoveDiskReplicas(const v1::RemoveDiskReplicasRequest& req,
                                          v1::RemoveDiskReplicasResponse* resp) = 0;
  virtual absl::Status TakeOffloadTasks(const v1::TakeOffloadTasksRequest& req,
                                        v1::TakeOffloadTasksResponse* resp) = 0;
  virtual absl::Status PromoteStart(const v1::PromoteStartRequest& req,
                                    v1::PromoteStartResponse* resp) = 0;
  virtual absl::Status PromoteEnd(const v1::PromoteEndRequest& req,
                                  v1::PromoteEndResponse* resp) = 0;
  // One chunk of the owner's object report after a registration (client/session/master_session.h).
  virtual absl::Status ReportObjects(const v1::ReportObjectsRequest& req,
                                     v1::ReportObjectsResponse* resp) = 0;
  // Self-repair: replicas this daemon found corrupt, holders that refused its connections.
  virtual absl::Status ReportReplicaFaults(const v1::ReportReplicaFaultsRequest& req,
                                           v1::ReportReplicaFaultsResponse* resp) = 0;
};

struct GrpcMasterClientOptions {
  std::string address;  // HOST:PORT of mc-master, or a comma list of them (standbys)
  int64_t rpc_timeout_ms = 10'000;
  int max_message_bytes = 256 << 20;
  // How long a queued lease release waits for this client's next GetReplicas to carry it (the
  // `releases` field) before it is sent in a ReleaseLeases of its own; 0 = always at once.
  int64_t release_delay_us = 1000;
  // The keys of releases carried by a lookup travel packed (ReleaseLeasesRequest.packed_keys: one
  // string for the master to parse instead of one per key), and so do those of a ReleaseLeases
  // that came packed. A master that does not read them answers releases_seen (keys_seen) 0: the
  // releases are sent again one by one, and release keys go one by one for
  // packed_release_retry_ms. Off: every release names its keys one by one.
  bool pack_release_keys = true;
  int64_t packed_release_retry_ms = 60'000;
  // The cluster credential; null = send no credentials (a master with --auth=false).
  auth::ClusterKeysPtr cluster_keys = nullptr;
  // Credentials of every channel to a master (each address, and a leader a standby names):
  // plaintext by default, TLS with ChannelSecurity::Make.
  ChannelSecurity security{};
  // The master lane when the master offers one: up to this many connections.
  bool lane = true;
  int lane_connections = 4;
  // Counts calls by path, mc_client_master_lane_calls_total{outcome}; null = not counted.
  MetricsRegistry* metrics = nullptr;
};

std::unique_ptr<MasterClient> CreateGrpcMasterClient(const GrpcMasterClientOptions& options);

}  // namespace mc::client
