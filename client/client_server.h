// ClientServer: runs one mc-client daemon: its memory segments, the data-plane server, the
// transfer engine, the session with the master (registration, heartbeats, re-registration), the
// Store gRPC service on TCP and a Unix socket (GpuBuffers beside it when the engine has a cuda
// transport), and the HTTP admin endpoint. mc-client's main only
// turns flags into ClientServerOptions. Start() returns once everything serves and the ready file
// is written; Shutdown() stops it all. Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "client/access/store_auth.h"
#include "client/batch/batch_get.h"
#include "client/batch/batch_put.h"
#include "client/batch/gpu_get_stager.h"
#include "client/batch/gpu_put_stager.h"
#include "client/batch/prefix_leases.h"
#include "client/buffers/buffer_registry.h"
#include "client/buffers/fd_channel.h"
#include "client/buffers/segment_pool.h"
#include "client/client_metrics.h"
#include "client/client_options.h"
#include "client/fast/fast_channel.h"
#include "client/gpu/gpu_buffers.h"
#include "client/gpu/gpu_fd_tickets.h"
#include "client/session/index_service.h"
#include "client/session/master_client.h"
#include "client/session/master_session.h"
#include "client/session/object_index.h"
#include "client/store/gpu_buffer_service.h"
#include "client/store/store_service.h"
#include "client/tier/offload_driver.h"
#include "common/auth.h"
#include "common/http_admin.h"
#include "common/metrics.h"
#include "transfer/data_server.h"
#include "transfer/tcp/server.h"
#include "transfer/transfer_engine.h"

namespace grpc {
class Server;
}

namespace mc::client {

class ClientServer {
 public:
  explicit ClientServer(ClientServerOptions options);
  ~ClientServer();

  absl::Status Start();
  void Shutdown();

  const std::string& grpc_address() const { return grpc_address_; }
  const std::string& http_address() const { return http_address_; }
  const std::string& data_endpoint() const { return data_endpoint_; }
  const std::string& client_id() const { return options_.client_id; }
  const std::string& fd_socket() const { return options_.fd_socket; }
  // The fast channel's socket; empty when off.
  const std::string& fast_socket() const { return fast_socket_; }

 private:
  // Start's phases, in order.
  void FillDefaults();
  absl::Status OpenMemory();
  absl::Status OpenDiskTier();
  absl::Status StartDataPlane();
  absl::Status StartTransferEngine();
  void StartSession();
  void BuildBatchPaths();
  void BuildGpuPaths();
  absl::Status AnnounceServing();
  absl::Status StartGrpc();
  absl::Status StartFdChannel();
  absl::Status StartFastChannel();
  absl::Status StartAdmin();
  std::string StatusLine();
  void OnCapabilityInfo(const MasterSession::CapabilityInfo& info);

  ClientServerOptions options_;
  MetricsRegistry registry_;
  ClientMetrics metrics_;
  transfer::SegmentTable segment_table_;
  std::unique_ptr<SegmentPool> pool_;
  // With object_index and segments: what our segments hold, for the report after a
  // registration; its notice handler serves the data plane's INDEX frames.
  std::unique_ptr<ObjectIndex> index_;
  SegmentResolver resolve_segment_;  // master segment id -> our segment's index (OpenMemory)
  std::unique_ptr<IndexNoticeHandler> index_handler_;
  std::unique_ptr<IndexNotifier> notifier_;  // with object_index: tells owners what we wrote
  std::unique_ptr<offload::DiskTier> tier_;
  std::unique_ptr<OffloadDriver> offload_;
  // With cluster_keys: checks the capability of every data-plane frame (outlives data_server_).
  std::unique_ptr<auth::CapabilityVerifier> capabilities_;
  std::unique_ptr<transfer::DataServer> data_server_;  // a tcp::TcpDataServer
  std::unique_ptr<transfer::TransferEngine> engine_;
  // The engine's data-plane ops (peers' rdma connection setups), registered with the data
  // server before the engine exists and answered by it once attached (StartTransferEngine).
  transfer::EngineDataOps engine_ops_;
  std::unique_ptr<MasterClient> master_;
  std::unique_ptr<MasterSession> session_;
  BufferRegistry buffers_;
  std::unique_ptr<PrefixLeases> prefix_leases_;
  std::unique_ptr<HolderBackoff> holder_backoff_;  // shared by the getter and the putter
  std::unique_ptr<BatchPutter> putter_;
  std::unique_ptr<BatchGetter> getter_;
  std::unique_ptr<Promoter> promoter_;
  std::unique_ptr<StoreGrpcService> store_;
  // With a cuda transport: the GPU buffers Store's BatchGet and BatchPut may name, their
  // service, and the stager of GPU put sources.
  // Declared after engine_ (its transport's CudaApi outlives every import) and destroyed before
  // store_, which only uses them while serving.
  std::unique_ptr<GpuBufferRegistry> gpu_buffers_;
  std::unique_ptr<GpuBufferService> gpu_service_;
  std::unique_ptr<GpuPutStager> gpu_put_stager_;
  std::unique_ptr<GpuGetStager> gpu_get_stager_;
  std::unique_ptr<GpuFdTickets> gpu_fd_tickets_;  // with the fd channel: parked POSIX-fd handles
  std::unique_ptr<StoreAuth> store_auth_;
  std::unique_ptr<FdChannelServer> fd_channel_;
  std::unique_ptr<FastChannelServer> fast_channel_;  // after fd_channel_: it asks its sessions
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<AdminServer> admin_;
  std::string grpc_address_;
  std::string http_address_;
  std::string data_endpoint_;
  std::string fast_socket_;
  bool stopped_ = false;
};

}  // namespace mc::client
