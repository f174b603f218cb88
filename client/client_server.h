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

struct ClientServerOptions {
  std::string master = "127.0.0.1:50051";  // mc-master gRPC
  // The cluster credential (common/auth.h); null = unauthenticated (--auth=false).
  auth::ClusterKeysPtr cluster_keys;
  // With cluster_keys: how long past its expiry (on the master's clock, as estimated from the
  // last heartbeat) a capability is still honoured (docs/security.md).
  int64_t capability_clock_skew_ms = 1000;
  std::string listen;                      // Store gRPC on TCP; empty = off (needs store_token)
  std::string unix_socket;                 // Store gRPC on a Unix socket; empty = off
  mode_t unix_socket_mode = 0660;          // of the Unix socket and the fd socket
  std::optional<gid_t> unix_socket_group;  // their group (default: the daemon's)
  std::string fd_socket;                   // the fd side channel; default <unix_socket>.fd
  std::string store_token;                 // required on `listen` unless !store_tcp_auth
  bool store_tcp_auth = true;
  FdChannelOptions fd_channel;       // path, mode and group are filled in
  BufferRegistryOptions buffers;     // metrics is filled in
  std::string http = "127.0.0.1:0";  // admin HTTP; empty = off
  std::string data = "127.0.0.1:0";  // data plane (tcp transport)
  std::string advertise_host;        // host peers use to reach `data` (default: its host)
  std::string ready_file;
  std::string client_id;  // default: host-pid-random
  std::string host;       // default: gethostname()
  SegmentPoolOptions segments;
  StoreServiceOptions store;      // client_id is filled in
  uint32_t get_lease_ttl_ms = 0;  // read lease asked by BatchGet; 0 = master default
  int64_t master_rpc_timeout_ms = 10'000;
  int64_t lease_release_delay_us = 1000;     // GrpcMasterClientOptions::release_delay_us
  int64_t put_no_space_wait_ms = 100;        // BatchPutOptions::no_space_wait_ms
  int64_t put_write_timeout_ms = 10'000;     // BatchPutOptions::write_timeout_ms
  int64_t put_write_back_wait_ms = 10'000;   // BatchPutOptions::write_back_wait_ms
  transfer::TransferEngineOptions transfer;  // local_endpoint and metrics are filled in
  // Data-plane server limits; listen_address, metrics and socket_buffer_bytes are filled in.
  transfer::tcp::TcpDataServerOptions data_server;
  // Admin HTTP limits; host, port and metrics are filled in from `http`.
  AdminServerOptions admin;
  // The SSD tier: on when offload.dir is set (offload.capacity bytes).
  offload::DiskTierOptions offload;  // metrics and reclaim_guard are filled in
  int64_t offload_poll_ms = 100;
  int offload_parallelism = 4;  // OffloadDriverOptions::parallelism
  // The owner-side object index (client/session/object_index.h): notices from writers, a report
  // after every registration, so a master restart or an expired session loses nothing.
  bool object_index = true;
  bool promote_on_hit = false;                                      // write SSD hits back to memory
  uint64_t promote_staging_bytes = Promoter::kDefaultStagingBytes;  // private copies per round
  GpuPutStagerOptions gpu_put;    // with a cuda transport: how GPU put sources are staged
  GpuGetStagerOptions gpu_get;    // with a cuda transport: how GPU get destinations are staged
  size_t gpu_max_buffers = 1024;  // GPU buffers registered at once, all callers
  size_t gpu_max_buffers_per_caller = 256;  // of one caller (owner key)
};

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

 private:
  absl::Status StartGrpc();
  absl::Status StartFdChannel();
  absl::Status StartAdmin();
  absl::Status OpenDiskTier();
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
  std::unique_ptr<IndexNoticeHandler> index_handler_;
  std::unique_ptr<IndexNotifier> notifier_;  // with object_index: tells owners what we wrote
  std::unique_ptr<offload::DiskTier> tier_;
  std::unique_ptr<OffloadDriver> offload_;
  // With cluster_keys: checks the capability of every data-plane frame (outlives data_server_).
  std::unique_ptr<auth::CapabilityVerifier> capabilities_;
  std::unique_ptr<transfer::DataServer> data_server_;  // a tcp::TcpDataServer
  std::unique_ptr<transfer::TransferEngine> engine_;
  // The engine's rdma transport once it exists: answers peers' rdma connection setups
  // (kRdmaConnect frames on the data plane); null before and when there is no rdma.
  std::atomic<transfer::rdma::RdmaTransport*> rdma_serving_{nullptr};
  std::unique_ptr<MasterClient> master_;
  std::unique_ptr<MasterSession> session_;
  BufferRegistry buffers_;
  std::unique_ptr<PrefixLeases> prefix_leases_;
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
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<AdminServer> admin_;
  std::string grpc_address_;
  std::string http_address_;
  std::string data_endpoint_;
  bool stopped_ = false;
};

}  // namespace mc::client
