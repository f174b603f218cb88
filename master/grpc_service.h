// MasterGrpcService: the Master gRPC service as thin handlers (proto in -> MasterApi call
// -> proto out), with per-RPC request/failure counters and latency histograms.
// With an RpcAuthenticator, every call is first bound to its caller (docs/security.md):
// RegisterClient to a registration proof, GetStatus to an admin proof or a session, Hello to
// nothing (it answers the run id that proofs name), every other call to a live session's token,
// and the handlers then act as that caller only (a request's client_id naming another client
// answers PERMISSION_DENIED). Refused calls change nothing.
// Thread-safe (gRPC calls handlers concurrently; MasterApi implementations are thread-safe).
#pragma once

#include <google/protobuf/arena.h>
#include <grpcpp/support/message_allocator.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "master/capability_minter.h"
#include "master/leader_election.h"
#include "master/master_api.h"
#include "master/rpc_auth.h"
#include "mcstore/v1/master.grpc.pb.h"

namespace mc::master {

// The credentials one call presents, whatever carried it (gRPC metadata, or a master lane
// frame): the x-mc-auth and x-mc-session values, each absent when not sent; `repeated`: a
// header was sent more than once (refused).
struct CallCredentials {
  std::optional<std::string_view> proof;
  std::optional<std::string_view> session;
  bool repeated = false;
};

// Callback (reactor) API: every handler here is short and non-blocking (in-memory tables under
// short locks), so it runs on gRPC's own threads without a hand-off to a sync worker pool, which
// saves a thread switch per RPC (measured in bench/README.md).
class MasterGrpcService final : public mcstore::v1::Master::CallbackService {
 public:
  // `auth` (borrowed, may be null): null serves every call unauthenticated (--auth=false).
  MasterGrpcService(MasterApi& service, MetricsRegistry& metrics, size_t max_batch_items,
                    RpcAuthenticator* auth = nullptr);
  // With authentication: the minter that gives owners their keys and replicas their
  // capabilities (borrowed, must outlive the service). Before serving; null = none.
  void SetCapabilityMinter(CapabilityMinter* minter) { minter_ = minter; }
  // With leader election (master/leader_election.h): a master whose gate says it does not serve
  // answers every call UNAVAILABLE ("mc-master standby; leader is HOST:PORT") with the leader's
  // address in trailing metadata `x-mc-leader`, before authenticating it. Borrowed, must
  // outlive the service; before serving; null = always serve (a single master).
  void SetLeaderGate(const LeaderGate* gate) { gate_ = gate; }
  // The master lane's port, advertised in RegisterClientResponse.lane_port; before serving.
  void SetLanePort(int port) { lane_port_ = port; }

  // Each RPC: counted and timed, checked against the batch limit, then handled by Do<Rpc>.
#define MC_MASTER_UNARY(Rpc)                                          \
  grpc::ServerUnaryReactor* Rpc(grpc::CallbackServerContext* ctx,     \
                                const mcstore::v1::Rpc##Request* req, \
                                mcstore::v1::Rpc##Response* resp) override;
  MC_MASTER_UNARY(RegisterClient)
  MC_MASTER_UNARY(Heartbeat)
  MC_MASTER_UNARY(UnregisterClient)
  MC_MASTER_UNARY(PutStart)
  MC_MASTER_UNARY(PutEnd)
  MC_MASTER_UNARY(PutRevoke)
  MC_MASTER_UNARY(GetReplicas)
  MC_MASTER_UNARY(ReleaseLeases)
  MC_MASTER_UNARY(Exist)
  MC_MASTER_UNARY(Remove)
  MC_MASTER_UNARY(AddDiskReplicas)
  MC_MASTER_UNARY(RemoveDiskReplicas)
  MC_MASTER_UNARY(PromoteStart)
  MC_MASTER_UNARY(PromoteEnd)
  MC_MASTER_UNARY(TakeOffloadTasks)
  MC_MASTER_UNARY(GetStatus)
  MC_MASTER_UNARY(Hello)
  MC_MASTER_UNARY(ReportObjects)
  MC_MASTER_UNARY(ReportReplicaFaults)
#undef MC_MASTER_UNARY

  // The master lane's entry (master/master_lane.h) for the calls it serves: the same front door
  // as the gRPC handlers above (leader gate, authentication, batch limit, per-RPC metrics,
  // Do<Rpc>), with the credentials the frame carried. A standby's refusal sets `*leader`.
#define MC_MASTER_LANE(Rpc)                                                                        \
  grpc::Status Lane##Rpc(const CallCredentials& credentials, const mcstore::v1::Rpc##Request& req, \
                         mcstore::v1::Rpc##Response* resp, std::string* leader);
  MC_MASTER_LANE(GetReplicas)
  MC_MASTER_LANE(ReleaseLeases)
  MC_MASTER_LANE(PutStart)
  MC_MASTER_LANE(PutEnd)
  MC_MASTER_LANE(PutRevoke)
  MC_MASTER_LANE(Exist)
  MC_MASTER_LANE(Remove)
#undef MC_MASTER_LANE

  // The handlers proper, without metrics, authentication or the batch limit, acting as `caller`
  // (tests/fakes/fake_master_client.h calls them directly with Caller{}: the request's client_id
  // is then taken as is).
  grpc::Status DoRegisterClient(const Caller& caller, const mcstore::v1::RegisterClientRequest* req,
                                mcstore::v1::RegisterClientResponse* resp);
  grpc::Status DoHeartbeat(const Caller& caller, const mcstore::v1::HeartbeatRequest* req,
                           mcstore::v1::HeartbeatResponse* resp);
  grpc::Status DoUnregisterClient(const Caller& caller,
                                  const mcstore::v1::UnregisterClientRequest* req,
                                  mcstore::v1::UnregisterClientResponse* resp);
  grpc::Status DoPutStart(const Caller& caller, const mcstore::v1::PutStartRequest* req,
                          mcstore::v1::PutStartResponse* resp);
  grpc::Status DoPutEnd(const Caller& caller, const mcstore::v1::PutEndRequest* req,
                        mcstore::v1::PutEndResponse* resp);
  grpc::Status DoPutRevoke(const Caller& caller, const mcstore::v1::PutRevokeRequest* req,
                           mcstore::v1::PutRevokeResponse* resp);
  grpc::Status DoGetReplicas(const Caller& caller, const mcstore::v1::GetReplicasRequest* req,
                             mcstore::v1::GetReplicasResponse* resp);
  grpc::Status DoReleaseLeases(const Caller& caller, const mcstore::v1::ReleaseLeasesRequest* req,
                               mcstore::v1::ReleaseLeasesResponse* resp);
  grpc::Status DoExist(const Caller& caller, const mcstore::v1::ExistRequest* req,
                       mcstore::v1::ExistResponse* resp);
  grpc::Status DoRemove(const Caller& caller, const mcstore::v1::RemoveRequest* req,
                        mcstore::v1::RemoveResponse* resp);
  grpc::Status DoAddDiskReplicas(const Caller& caller,
                                 const mcstore::v1::AddDiskReplicasRequest* req,
                                 mcstore::v1::AddDiskReplicasResponse* resp);
  grpc::Status DoRemoveDiskReplicas(const Caller& caller,
                                    const mcstore::v1::RemoveDiskReplicasRequest* req,
                                    mcstore::v1::RemoveDiskReplicasResponse* resp);
  grpc::Status DoPromoteStart(const Caller& caller, const mcstore::v1::PromoteStartRequest* req,
                              mcstore::v1::PromoteStartResponse* resp);
  grpc::Status DoPromoteEnd(const Caller& caller, const mcstore::v1::PromoteEndRequest* req,
                            mcstore::v1::PromoteEndResponse* resp);
  grpc::Status DoTakeOffloadTasks(const Caller& caller,
                                  const mcstore::v1::TakeOffloadTasksRequest* req,
                                  mcstore::v1::TakeOffloadTasksResponse* resp);
  grpc::Status DoReportObjects(const Caller& caller, const mcstore::v1::ReportObjectsRequest* req,
                               mcstore::v1::ReportObjectsResponse* resp);
  grpc::Status DoReportReplicaFaults(const Caller& caller,
                                     const mcstore::v1::ReportReplicaFaultsRequest* req,
                                     mcstore::v1::ReportReplicaFaultsResponse* resp);
  grpc::Status DoGetStatus(const Caller& caller, const mcstore::v1::GetStatusRequest* req,
                           mcstore::v1::GetStatusResponse* resp);
  grpc::Status DoHello(const Caller& caller, const mcstore::v1::HelloRequest* req,
                       mcstore::v1::HelloResponse* resp);

 private:
  template <typename Req, typename Resp>
  using Handler = grpc::Status (MasterGrpcService::*)(const Caller&, const Req*, Resp*);
  // Binds the call to its caller (see the header comment); counts and logs a refusal.
  template <typename Req>
  grpc::Status Authenticate(const CallCredentials& credentials, const char* rpc, const Req& req,
                            Caller* caller);
  grpc::Status Refuse(const char* rpc, AuthFailure reason, const absl::Status& why);
  // The front door of every call, whatever carried it: leader gate (a standby sets `*leader`),
  // authentication, batch limit, per-RPC metrics, then `handler`.
  template <typename Req, typename Resp>
  grpc::Status Answer(const char* rpc, const CallCredentials& credentials, const Req& req,
                      Resp* resp, Handler<Req, Resp> handler, std::string* leader);
  template <typename Req, typename Resp>
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* ctx, const char* rpc, const Req* req,
                                  Resp* resp, Handler<Req, Resp> handler);

  // Request and response of one call on one protobuf arena: the batched RPCs parse and build
  // thousands of small messages and strings, which then cost a pointer bump each and are freed
  // at once when the call ends.
  template <typename Req, typename Resp>
  class ArenaAllocator final : public grpc::MessageAllocator<Req, Resp> {
    class Holder final : public grpc::MessageHolder<Req, Resp> {
     public:
      Holder() {
        this->set_request(google::protobuf::Arena::CreateMessage<Req>(&arena_));
        this->set_response(google::protobuf::Arena::CreateMessage<Resp>(&arena_));
      }
      void Release() override { delete this; }

     private:
      google::protobuf::Arena arena_;
    };

   public:
    grpc::MessageHolder<Req, Resp>* AllocateMessages() override { return new Holder; }
  };

  struct RpcMetrics {
    Counter& requests;
    Counter& failures;
    Histogram& latency;
  };
  // The metrics of one RPC, looked up in the registry once.
  RpcMetrics& MetricsFor(const char* rpc);

  MasterApi& service_;
  MetricsRegistry& metrics_;
  const size_t max_batch_items_;
  RpcAuthenticator* const auth_;
  CapabilityMinter* minter_ = nullptr;
  const LeaderGate* gate_ = nullptr;
  int lane_port_ = 0;
  absl::Mutex rpc_metrics_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<RpcMetrics>> rpc_metrics_
      ABSL_GUARDED_BY(rpc_metrics_mu_);
  ArenaAllocator<mcstore::v1::GetReplicasRequest, mcstore::v1::GetReplicasResponse>
      get_replicas_alloc_;
  ArenaAllocator<mcstore::v1::ReleaseLeasesRequest, mcstore::v1::ReleaseLeasesResponse>
      release_leases_alloc_;
  ArenaAllocator<mcstore::v1::ExistRequest, mcstore::v1::ExistResponse> exist_alloc_;
  ArenaAllocator<mcstore::v1::RemoveRequest, mcstore::v1::RemoveResponse> remove_alloc_;
  ArenaAllocator<mcstore::v1::PutStartRequest, mcstore::v1::PutStartResponse> put_start_alloc_;
  ArenaAllocator<mcstore::v1::PutEndRequest, mcstore::v1::PutEndResponse> put_end_alloc_;
};

}  // namespace mc::master
