// ClientServerOptions: everything one mc-client daemon is configured with (client_main.cc turns
// the flags into it), and Validate(), which names every problem at once, each with its flag.
// Components keep their own options structs (StoreServiceOptions, BufferRegistryOptions ...);
// this one nests them and the daemon-wide settings. ClientServer::Start() refuses options that
// do not validate.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "client/batch/gpu_get_stager.h"
#include "client/batch/gpu_put_stager.h"
#include "client/batch/promoter.h"
#include "client/buffers/buffer_registry.h"
#include "client/buffers/fd_channel.h"
#include "client/buffers/segment_pool.h"
#include "client/fast/fast_channel.h"
#include "client/store/store_service.h"
#include "common/auth.h"
#include "common/http_admin.h"
#include "offload/disk_tier.h"
#include "proto/grpc_tls.h"
#include "transfer/tcp/server.h"
#include "transfer/transfer_engine.h"

namespace mc::client {

struct ClientServerOptions {
  std::string master = "127.0.0.1:50051";  // mc-master gRPC
  // TLS towards the master (proto/grpc_tls.h): on when ca_file is set (ca_file and server_name
  // only; the daemon's own certificate, `tls` below, is its client certificate when set). Every
  // master address (a leader a standby names included) is dialled with these credentials.
  TlsChannelFiles master_tls;
  // The cluster credential (common/auth.h); null = unauthenticated (--auth=false).
  auth::ClusterKeysPtr cluster_keys;
  // With cluster_keys: how long past its expiry (on the master's clock, as estimated from the
  // last heartbeat) a capability is still honoured (docs/security.md).
  int64_t capability_clock_skew_ms = 1000;
  std::string listen;       // Store gRPC on TCP; empty = off (needs store_token)
  std::string unix_socket;  // Store gRPC on a Unix socket; empty = off
  // TLS on the TCP Store listener (`listen`); the Unix socket stays plaintext.
  TlsServerFiles tls;
  // Store gRPC (TCP and Unix socket): a connection that has not completed its HTTP/2 handshake
  // within this is closed (docs/security.md, "Connections before any credential").
  int64_t grpc_handshake_timeout_ms = 5000;
  mode_t unix_socket_mode = 0660;          // of the Unix socket and the fd socket
  std::optional<gid_t> unix_socket_group;  // their group (default: the daemon's)
  std::string fd_socket;                   // the fd side channel; default <unix_socket>.fd
  std::string store_token;                 // required on `listen` unless !store_tcp_auth
  bool store_tcp_auth = true;
  FdChannelOptions fd_channel;       // path, mode and group are filled in
  bool store_fast_channel = true;    // Store calls without gRPC on <unix_socket>.fast
  FastChannelOptions fast_channel;   // path, mode and group are filled in
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
  int64_t lease_release_delay_us = 1000;    // GrpcMasterClientOptions::release_delay_us
  bool master_lane = true;                  // GrpcMasterClientOptions::lane
  int master_lane_connections = 4;          // GrpcMasterClientOptions::lane_connections (1..64)
  int64_t put_no_space_wait_ms = 100;       // BatchPutOptions::no_space_wait_ms
  int64_t put_write_timeout_ms = 10'000;    // BatchPutOptions::write_timeout_ms
  int64_t put_write_back_wait_ms = 10'000;  // BatchPutOptions::write_back_wait_ms
  // A holder that refused a connection is skipped this long by gets and puts (HolderBackoff);
  // 0 = never skipped.
  int64_t holder_backoff_ms = 2000;
  transfer::TransferEngineOptions transfer;  // local_endpoint and metrics are filled in
  // Data-plane server limits; listen_address, metrics and socket_buffers are filled in.
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
  // Speculative local copies on the get path (BatchGetter::SetSpeculation; needs object_index).
  bool get_speculative_local = true;
  int64_t get_speculative_max_keys = 64;             // SpeculationSource::max_job_keys
  uint64_t get_speculative_max_bytes = 16ull << 20;  // SpeculationSource::max_job_bytes
  bool promote_on_hit = false;                       // write SSD hits back to memory
  uint64_t promote_staging_bytes = Promoter::kDefaultStagingBytes;  // private copies per round
  GpuPutStagerOptions gpu_put;    // with a cuda transport: how GPU put sources are staged
  GpuGetStagerOptions gpu_get;    // with a cuda transport: how GPU get destinations are staged
  size_t gpu_max_buffers = 1024;  // GPU buffers registered at once, all callers
  size_t gpu_max_buffers_per_caller = 256;  // of one caller (owner key)

  // Every problem of these options, each naming the flag it comes from; empty when they can
  // be served.
  std::vector<std::string> Validate() const;
};

}  // namespace mc::client
