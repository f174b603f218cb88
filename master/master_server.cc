#include "master/master_server.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "common/util.h"
#include "master/etcd_http.h"
#include "master/master_status_page.h"
#include "proto/grpc_server_limits.h"

namespace mc::master {

std::vector<std::string> MasterServerOptions::Validate() const {
  std::vector<std::string> problems;
  auto check = [&](bool ok, const char* problem) {
    if (!ok) problems.emplace_back(problem);
  };
  const double high = master.eviction.high_watermark, low = master.eviction.low_watermark;
  check(low > 0 && low <= high && high <= 1.0, "need 0 < --low_watermark <= --high_watermark <= 1");
  check(admin.max_connections >= 1, "--http_max_connections must be >= 1");
  check(admin.max_connections_per_peer >= 1, "--http_max_connections_per_peer must be >= 1");
  check(admin.request_timeout_ms >= 1, "--http_request_timeout_ms must be >= 1");
  check(rpc_auth.max_clock_skew_ms >= 1, "--auth_max_clock_skew_ms must be >= 1");
  check(rpc_auth.replay_cache_entries >= 1, "--auth_replay_cache_entries must be >= 1");
  check(etcd_user.empty() == etcd_password.empty(),
        "--etcd_user and --etcd_password_file go together");
  check(leader_ttl_s >= 2, "--leader_ttl_s must be >= 2");
  check(master.object_report_timeout_ms >= 0, "--object_report_timeout_ms must be >= 0");
  check(master.forget_batch >= 1, "--forget_batch must be >= 1");
  check(master.forget_queue_limit >= 1, "--forget_queue_limit must be >= 1");
  check(lane_max_connections >= 1 && lane_max_connections <= 65536,
        "--lane_max_connections must be in 1..65536");
  check(lane_max_connections_per_address >= 1 && lane_max_connections_per_address <= 65536,
        "--lane_max_connections_per_address must be in 1..65536");
  check(lane_idle_timeout_ms >= 100 && lane_idle_timeout_ms <= 3'600'000,
        "--lane_idle_timeout_ms must be in 100..3600000");
  for (std::string& p : TlsServerProblems(tls)) problems.push_back(std::move(p));
  return problems;
}

MasterServer::MasterServer(MasterServerOptions options)
    : options_(std::move(options)), maintenance_(RealClock::Get(), [this] {
        service_->RunMaintenance();
        EndRevokedSessions();
        return options_.maintenance_interval_ms;
      }) {}

void MasterServer::EndRevokedSessions() {
  if (rpc_auth_ == nullptr) return;
  for (const RpcAuthenticator::RevokedSession& r : rpc_auth_->TakeRevokedSessions()) {
    // Its owner key is forgotten with the session: no capability for its memory is minted any
    // more (those minted before expire with their TTL; docs/security.md).
    absl::Status s = service_->UnregisterClient(r.client_id, r.session);
    if (s.ok() && minter_ != nullptr) minter_->Forget(r.client_id);
    Logger("master").warn("member credential of {} serial {} revoked: {}", r.client_id, r.serial,
                          s.ok() ? "its session is ended" : "its session had already ended");
  }
}

MasterServer::~MasterServer() { Shutdown(); }

absl::Status MasterServer::Start() {
  if (std::vector<std::string> problems = options_.Validate(); !problems.empty()) {
    return McError(Code::kInvalidArgument, absl::StrJoin(problems, "; "));
  }
  auto listen = ParseHostPort(options_.listen);
  if (!listen.ok()) return listen.status();
  service_ = std::make_unique<MetadataService>(options_.master, RealClock::Get(), metrics_);
  if (options_.cluster_keys) {
    rpc_auth_ =
        std::make_unique<RpcAuthenticator>(options_.cluster_keys, options_.rpc_auth, metrics_);
    Logger("master").info("master RPCs authenticated (cluster secret fingerprint {}, {} secret(s))",
                          options_.cluster_keys->fingerprint(),
                          options_.cluster_keys->secret_count());
  } else {
    Logger("master").warn(
        "master RPCs NOT authenticated (--auth=false): any process that can "
        "reach {} may act as any client",
        options_.listen);
  }
  grpc_service_ = std::make_unique<MasterGrpcService>(*service_, metrics_, options_.max_batch_items,
                                                      rpc_auth_.get());
  if (!options_.etcd_endpoints.empty()) grpc_service_->SetLeaderGate(&gate_);
  if (options_.cluster_keys != nullptr) {
    minter_ = std::make_unique<CapabilityMinter>(options_.cluster_keys, RealClock::Get());
    grpc_service_->SetCapabilityMinter(minter_.get());
  }

  AddStatusGauges();

  MC_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                      MakeServerCredentials(options_.tls));
  if (options_.tls.enabled()) {
    Logger("master").info(
        "gRPC listener {} serves TLS{}", options_.listen,
        options_.tls.client_ca_file.empty() ? "" : " (client certificates required)");
  }
  // Before gRPC serves: every registration answer names the lane's port.
  MC_RETURN_IF_ERROR(StartLane(listen->host));
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(options_.listen, credentials, &bound_port);
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  builder.SetMaxSendMessageSize(options_.max_message_bytes);
  MC_RETURN_IF_ERROR(SetGrpcHandshakeTimeout(builder, options_.grpc_handshake_timeout_ms));
  builder.RegisterService(grpc_service_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || bound_port == 0) {
    return McError(Code::kUnavailable, absl::StrCat("cannot listen on ", options_.listen));
  }
  grpc_address_ = absl::StrCat(listen->host, ":", bound_port);
  if (!options_.etcd_endpoints.empty()) MC_RETURN_IF_ERROR(StartElection());

  if (!options_.http.empty()) MC_RETURN_IF_ERROR(StartAdmin());
  maintenance_.Start(options_.maintenance_interval_ms);
  if (!options_.ready_file.empty()) {
    absl::Status s = WriteReadyFile(
        options_.ready_file,
        {{"grpc", grpc_address_}, {"http", http_address_}, {"lane", std::to_string(lane_port_)}});
    if (!s.ok()) return s;
  }
  Logger("master").info("mc-master serving gRPC on {}, HTTP on {}{}", grpc_address_,
                        http_address_.empty() ? "(off)" : http_address_,
                        election_ ? " (standby until it wins the etcd election)" : "");
  return absl::OkStatus();
}

void MasterServer::AddStatusGauges() {
  MetadataService* svc = service_.get();
  metrics_.AddCallbackGauge("mc_memory_used_bytes", "Memory allocated in client segments",
                            [svc] { return static_cast<double>(svc->Snapshot().mem_used); });
  metrics_.AddCallbackGauge("mc_memory_capacity_bytes", "Memory of all client segments",
                            [svc] { return static_cast<double>(svc->Snapshot().mem_capacity); });
  metrics_.AddCallbackGauge("mc_keys", "Objects known (pending and complete)",
                            [svc] { return static_cast<double>(svc->KeyCount()); });
  metrics_.AddCallbackGauge("mc_clients_alive", "Registered, heartbeating clients",
                            [svc] { return static_cast<double>(svc->Clients().size()); });
  metrics_.AddCallbackGauge("mc_leases_active", "Live read leases",
                            [svc] { return static_cast<double>(svc->ActiveLeaseCount()); });
  metrics_.AddCallbackGauge("mc_ssd_used_bytes", "SSD tier bytes used, all clients",
                            [svc] { return static_cast<double>(svc->Snapshot().disk_used); });
  metrics_.AddCallbackGauge("mc_ssd_capacity_bytes", "SSD tier capacity, all clients",
                            [svc] { return static_cast<double>(svc->Snapshot().disk_capacity); });
}

absl::Status MasterServer::StartLane(const std::string& listen_host) {
  if (!options_.lane) return absl::OkStatus();
  lane_ = std::make_unique<MasterLane>(
      MasterLaneOptions{.listen = options_.lane_listen.empty() ? absl::StrCat(listen_host, ":0")
                                                               : options_.lane_listen,
                        .max_connections = options_.lane_max_connections,
                        .max_connections_per_address = options_.lane_max_connections_per_address,
                        .idle_timeout_ms = options_.lane_idle_timeout_ms,
                        .max_body_bytes = static_cast<size_t>(options_.max_message_bytes),
                        .tls = options_.tls,
                        .handshake_timeout_ms = options_.grpc_handshake_timeout_ms},
      *grpc_service_, metrics_);
  MC_ASSIGN_OR_RETURN(lane_port_, lane_->Start());
  grpc_service_->SetLanePort(lane_port_);
  Logger("master").info("master lane on port {}{}", lane_port_,
                        options_.tls.enabled() ? " (TLS, as the gRPC listener)" : "");
  return absl::OkStatus();
}

absl::Status MasterServer::StartAdmin() {
  auto http = ParseHostPort(options_.http);
  if (!http.ok()) return http.status();
  AdminServerOptions admin_opts = options_.admin;
  admin_opts.host = http->host;
  admin_opts.port = http->port;
  admin_opts.metrics = &metrics_;
  admin_ = std::make_unique<AdminServer>(admin_opts);
  admin_->Handle("/metrics", "text/plain; version=0.0.4",
                 [this] { return metrics_.RenderPrometheus(); });
  MetadataService* svc = service_.get();
  LeaderElection* election = election_.get();
  admin_->Handle("/status", "text/plain", [svc, election] {
    std::string line = svc->StatusLine();
    if (election != nullptr) line += " " + election->StatusLine();
    return line + "\n";
  });
  for (const char* path : {"/status.html", "/"}) {
    admin_->Handle(path, "text/html; charset=utf-8", [this, svc, election] {
      return MasterStatusHtml(*svc, election, metrics_, RealClock::Get());
    });
  }
  // 200 for a healthy standby too: a liveness probe must not kill standbys.
  admin_->Handle("/healthz", "text/plain", [] { return std::string("ok\n"); });
  auto bound = admin_->Start();
  if (!bound.ok()) return bound.status();
  http_address_ = *bound;
  return absl::OkStatus();
}

absl::Status MasterServer::StartElection() {
  std::string advertise =
      options_.advertise_address.empty() ? grpc_address_ : options_.advertise_address;
  absl::StatusOr<HostPort> hp = ParseHostPort(advertise);
  if (!hp.ok()) return hp.status();
  if (hp->host.empty() || hp->host == "0.0.0.0" || hp->host == "::" || hp->host == "[::]" ||
      hp->port == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "with --etcd_endpoints, --advertise_address must name the HOST:PORT clients reach this "
        "master at (got '",
        advertise, "')"));
  }
  EtcdHttpOptions etcd{.endpoints = options_.etcd_endpoints,
                       .ca_file = options_.etcd_ca_file,
                       .cert_file = options_.etcd_cert_file,
                       .key_file = options_.etcd_key_file,
                       .user = options_.etcd_user,
                       .password = options_.etcd_password};
  MC_ASSIGN_OR_RETURN(etcd_, CreateEtcdHttpKv(etcd));
  for (const std::string& e : etcd.endpoints) {
    if (e.rfind("http://", 0) == 0 && e.find("://127.") == std::string::npos &&
        e.find("://localhost") == std::string::npos && e.find("://[::1]") == std::string::npos) {
      Logger("master").warn(
          "etcd endpoint {} is plain http off this host: anyone on the path can read and forge "
          "the election (use https:// with --etcd_ca_file, and --etcd_user)",
          e);
    }
  }
  if (etcd.user.empty()) {
    Logger("master").info(
        "etcd without authentication: whoever reaches etcd can take the leadership "
        "(--etcd_user / --etcd_password_file)");
  }
  LeaderElectionOptions eo;
  eo.key = options_.etcd_prefix + "leader";
  eo.advertise = advertise;
  eo.ttl_s = options_.leader_ttl_s;
  election_ = std::make_unique<LeaderElection>(eo, *etcd_, RealClock::Get(), metrics_);
  gate_.gate.store(election_.get(), std::memory_order_release);
  election_->Start(options_.on_leadership_lost);
  return absl::OkStatus();
}

void MasterServer::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&stopping_));
}

void MasterServer::Shutdown() {
  absl::MutexLock shutdown_lock(&shutdown_mu_);
  if (shut_down_) return;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;  // releases Wait()
  }
  // A leader steps down first (revokes its lease), so a standby takes over at once.
  if (election_) election_->Stop();
  maintenance_.Stop();
  if (lane_) lane_->Stop();
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.reset();
  }
  if (admin_) admin_->Stop();
  shut_down_ = true;
}

}  // namespace mc::master
