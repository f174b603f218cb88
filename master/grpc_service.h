// MasterGrpcService: the Master gRPC service as thin handlers (proto in -> MetadataService call
// -> proto out), with per-RPC request/failure counters and latency histograms.
// Thread-safe (gRPC calls handlers concurrently; MetadataService is thread-safe).
#pragma once

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "master/metadata_service.h"
#include "mcstore/v1/master.grpc.pb.h"

namespace mc::master {

class MasterGrpcService final : public mcstore::v1::Master::Service {
 public:
  MasterGrpcService(MetadataService& service, MetricsRegistry& metrics, size_t max_batch_items)
      : service_(service), metrics_(metrics), max_batch_items_(max_batch_items) {}

  grpc::Status RegisterClient(grpc::ServerContext*, const mcstore::v1::RegisterClientRequest*,
                              mcstore::v1::RegisterClientResponse*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const mcstore::v1::HeartbeatRequest*,
                         mcstore::v1::HeartbeatResponse*) override;
  grpc::Status UnregisterClient(grpc::ServerContext*, const mcstore::v1::UnregisterClientRequest*,
                                mcstore::v1::UnregisterClientResponse*) override;
  grpc::Status PutStart(grpc::ServerContext*, const mcstore::v1::PutStartRequest*,
                        mcstore::v1::PutStartResponse*) override;
  grpc::Status PutEnd(grpc::ServerContext*, const mcstore::v1::PutEndRequest*,
                      mcstore::v1::PutEndResponse*) override;
  grpc::Status PutRevoke(grpc::ServerContext*, const mcstore::v1::PutRevokeRequest*,
                         mcstore::v1::PutRevokeResponse*) override;
  grpc::Status GetReplicas(grpc::ServerContext*, const mcstore::v1::GetReplicasRequest*,
                           mcstore::v1::GetReplicasResponse*) override;
  grpc::Status ReleaseLeases(grpc::ServerContext*, const mcstore::v1::ReleaseLeasesRequest*,
                             mcstore::v1::ReleaseLeasesResponse*) override;
  grpc::Status Exist(grpc::ServerContext*, const mcstore::v1::ExistRequest*,
                     mcstore::v1::ExistResponse*) override;
  grpc::Status Remove(grpc::ServerContext*, const mcstore::v1::RemoveRequest*,
                      mcstore::v1::RemoveResponse*) override;
  grpc::Status AddDiskReplicas(grpc::ServerContext*, const mcstore::v1::AddDiskReplicasRequest*,
                               mcstore::v1::AddDiskReplicasResponse*) override;
  grpc::Status RemoveDiskReplicas(grpc::ServerContext*,
                                  const mcstore::v1::RemoveDiskReplicasRequest*,
                                  mcstore::v1::RemoveDiskReplicasResponse*) override;
  grpc::Status PromoteStart(grpc::ServerContext*, const mcstore::v1::PromoteStartRequest*,
                            mcstore::v1::PromoteStartResponse*) override;
  grpc::Status PromoteEnd(grpc::ServerContext*, const mcstore::v1::PromoteEndRequest*,
                          mcstore::v1::PromoteEndResponse*) override;
  grpc::Status TakeOffloadTasks(grpc::ServerContext*, const mcstore::v1::TakeOffloadTasksRequest*,
                                mcstore::v1::TakeOffloadTasksResponse*) override;
  grpc::Status GetStatus(grpc::ServerContext*, const mcstore::v1::GetStatusRequest*,
                         mcstore::v1::GetStatusResponse*) override;

 private:
  class RpcScope;
  struct RpcMetrics {
    Counter& requests;
    Counter& failures;
    Histogram& latency;
  };
  // The metrics of one RPC, looked up in the registry once.
  RpcMetrics& MetricsFor(const char* rpc);

  MetadataService& service_;
  MetricsRegistry& metrics_;
  const size_t max_batch_items_;
  absl::Mutex rpc_metrics_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<RpcMetrics>> rpc_metrics_
      ABSL_GUARDED_BY(rpc_metrics_mu_);
};

}  // namespace mc::master
