// MasterServer: runs one mc-master: the gRPC Master service, the HTTP admin endpoint
// (/metrics, /status, /healthz) and the maintenance loop (liveness, put timeouts, lease sweep,
// watermark eviction). mc-master's main only turns flags into MasterServerOptions.
// Start() returns once serving; Shutdown() stops everything. Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "common/auth.h"
#include "common/clock.h"
#include "common/http_admin.h"
#include "common/metrics.h"
#include "master/grpc_service.h"
#include "master/metadata_service.h"
#include "master/rpc_auth.h"

namespace grpc {
class Server;
}

namespace mc::master {

struct MasterServerOptions {
  std::string listen = "127.0.0.1:50051";  // gRPC; port 0 picks a free one
  std::string http = "127.0.0.1:0";        // admin HTTP; empty disables it
  std::string ready_file;                  // written as JSON once serving
  int64_t maintenance_interval_ms = 200;
  size_t max_batch_items = 100'000;        // per batched RPC
  int max_message_bytes = 256 << 20;
  MasterOptions master;
  AdminServerOptions admin;  // limits; host, port and metrics come from `http`
  // The cluster credential (common/auth.h); null = unauthenticated (--auth=false).
  auth::ClusterKeysPtr cluster_keys;
  RpcAuthOptions rpc_auth;  // proof time window and replay cache (with cluster_keys only)
};

class MasterServer {
 public:
  explicit MasterServer(MasterServerOptions options);
  ~MasterServer();

  absl::Status Start();
  void Shutdown();
  // Blocks until Shutdown() is called from another thread.
  void Wait();

  const std::string& grpc_address() const { return grpc_address_; }
  const std::string& http_address() const { return http_address_; }
  MetadataService& service() { return *service_; }
  MetricsRegistry& metrics() { return metrics_; }

 private:
  void MaintenanceLoop();

  const MasterServerOptions options_;
  MetricsRegistry metrics_;
  std::unique_ptr<MetadataService> service_;
  std::unique_ptr<RpcAuthenticator> rpc_auth_;  // null: unauthenticated
  std::unique_ptr<CapabilityMinter> minter_;    // with cluster keys only
  std::unique_ptr<MasterGrpcService> grpc_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<AdminServer> admin_;
  std::string grpc_address_;
  std::string http_address_;
  std::thread maintenance_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
};

}  // namespace mc::master
