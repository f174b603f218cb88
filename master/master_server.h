// MasterServer: runs one mc-master: the gRPC Master service, the HTTP admin endpoint
// (/metrics, /status, /healthz) and the maintenance loop (liveness, put timeouts, lease sweep,
// watermark eviction); with etcd endpoints, the leader election that decides whether it serves.
// mc-master's main only turns flags into MasterServerOptions. Start() returns once serving;
// Shutdown() stops everything. Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/clock.h"
#include "common/http_admin.h"
#include "common/metrics.h"
#include "common/periodic_thread.h"
#include "master/grpc_service.h"
#include "master/leader_election.h"
#include "master/master_lane.h"
#include "master/metadata_service.h"
#include "master/rpc_auth.h"
#include "proto/grpc_tls.h"

namespace grpc {
class Server;
}

namespace mc::master {

struct MasterServerOptions {
  std::string listen = "127.0.0.1:50051";  // gRPC; port 0 picks a free one
  std::string http = "127.0.0.1:0";        // admin HTTP; empty disables it
  std::string ready_file;                  // written as JSON once serving
  int64_t maintenance_interval_ms = 200;
  size_t max_batch_items = 100'000;  // per batched RPC
  int max_message_bytes = 256 << 20;
  // A gRPC connection that has not completed its HTTP/2 handshake (sent its preface and
  // SETTINGS) within this is closed: silent connections cannot pile up before any credential
  // is checked (docs/security.md, "Connections before any credential").
  int64_t grpc_handshake_timeout_ms = 5000;
  // TLS on the gRPC listener (proto/grpc_tls.h): off without a certificate; with a client CA
  // every caller must present a certificate that chains to it.
  TlsServerFiles tls;
  // The master lane (master/master_lane.h): the daemons' hot calls over TCP; with `tls` over TLS
  // with the same files (the handshake bounded by grpc_handshake_timeout_ms). lane_listen "" =
  // the host of `listen`,
  // port 0 (any free port; advertised to clients in their registration answer).
  bool lane = true;
  std::string lane_listen;
  size_t lane_max_connections = 4096;
  size_t lane_max_connections_per_address = 64;
  int64_t lane_idle_timeout_ms = 60'000;
  MasterOptions master;
  AdminServerOptions admin;  // limits; host, port and metrics come from `http`
  // The cluster credential (common/auth.h); null = unauthenticated (--auth=false).
  auth::ClusterKeysPtr cluster_keys;
  RpcAuthOptions rpc_auth;  // proof time window and replay cache (with cluster_keys only)

  // Standby masters (master/leader_election.h). No endpoints = no election: this master leads.
  std::vector<std::string> etcd_endpoints;  // http://HOST:PORT or https://HOST:PORT each
  std::string etcd_prefix = "/mcstore/";    // the election key is prefix + "leader"
  // TLS and authentication towards etcd (master/etcd_http.h): CA bundle, client certificate
  // and key, user and password (read from a private file by mc-master).
  std::string etcd_ca_file, etcd_cert_file, etcd_key_file, etcd_user, etcd_password;
  // The gRPC HOST:PORT clients reach this master at, the election key's value; "" = the bound
  // listen address. With etcd it must name a host (not 0.0.0.0, ::, or nothing).
  std::string advertise_address;
  int64_t leader_ttl_s = 3;  // etcd lease TTL
  // Called once (on the election's thread) when this master lost its leadership; it serves
  // nothing more. mc-master exits non-zero.
  std::function<void()> on_leadership_lost;

  // Every problem of these options, each naming its mc-master flag; empty when they can be
  // served. MasterServer::Start() refuses options that do not validate.
  std::vector<std::string> Validate() const;
};

class MasterServer {
 public:
  explicit MasterServer(MasterServerOptions options);
  ~MasterServer();

  absl::Status Start();
  // Stops everything; idempotent (a second caller returns once the first is done).
  void Shutdown() ABSL_LOCKS_EXCLUDED(shutdown_mu_, mu_);
  // Blocks until Shutdown() is called from another thread.
  void Wait() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& grpc_address() const { return grpc_address_; }
  const std::string& http_address() const { return http_address_; }
  // The master lane's bound port; 0 when it is not open.
  int lane_port() const { return lane_port_; }
  MasterLane* lane() { return lane_.get(); }
  MetadataService& service() { return *service_; }
  MetricsRegistry& metrics() { return metrics_; }
  // The election; null without etcd.
  LeaderElection* election() { return election_.get(); }

 private:
  absl::Status StartElection();
  // Start()'s steps: the gauges of the service's figures; the HTTP admin server (--http).
  void AddStatusGauges();
  absl::Status StartAdmin();
  absl::Status StartLane(const std::string& listen_host);

  // The service's gate from before the election exists (the advertised address may be known
  // only once bound): nothing serves until the election says so.
  class ElectionGate final : public LeaderGate {
   public:
    bool Serving() const override {
      const LeaderGate* g = gate.load(std::memory_order_acquire);
      return g != nullptr && g->Serving();
    }
    std::string LeaderAddress() const override {
      const LeaderGate* g = gate.load(std::memory_order_acquire);
      return g != nullptr ? g->LeaderAddress() : std::string();
    }
    std::atomic<const LeaderGate*> gate{nullptr};
  };

  const MasterServerOptions options_;
  MetricsRegistry metrics_;
  std::unique_ptr<MetadataService> service_;
  // Maintenance: ends the sessions of members whose credential was revoked since they registered.
  void EndRevokedSessions();
  std::unique_ptr<RpcAuthenticator> rpc_auth_;  // null: unauthenticated
  std::unique_ptr<CapabilityMinter> minter_;    // with cluster keys only
  std::unique_ptr<MasterGrpcService> grpc_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MasterLane> lane_;  // after grpc_service_: stopped before it goes
  int lane_port_ = 0;
  std::unique_ptr<AdminServer> admin_;
  ElectionGate gate_;
  std::unique_ptr<EtcdKv> etcd_;
  std::unique_ptr<LeaderElection> election_;
  std::string grpc_address_;
  std::string http_address_;
  // Liveness, put timeouts, lease sweep, watermark eviction: service_->RunMaintenance().
  PeriodicThread maintenance_;
  absl::Mutex shutdown_mu_;  // one Shutdown() at a time
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  absl::Mutex mu_ ABSL_ACQUIRED_AFTER(shutdown_mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace mc::master
