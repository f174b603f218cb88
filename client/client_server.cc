#include "client/client_server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <random>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/client_status_page.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "common/util.h"
#include "proto/grpc_server_limits.h"

namespace mc::client {

namespace {

std::string DefaultHost() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

std::string DefaultClientId(const std::string& host) {
  std::random_device rd;
  return absl::StrFormat("%s-%d-%08x", host, getpid(), rd());
}

}  // namespace

namespace {

BufferRegistryOptions BufferOptions(BufferRegistryOptions options, MetricsRegistry& registry) {
  options.metrics = &registry;
  return options;
}

}  // namespace

ClientServer::ClientServer(ClientServerOptions options)
    : options_(std::move(options)),
      metrics_(registry_),
      buffers_(BufferOptions(options_.buffers, registry_)) {}

ClientServer::~ClientServer() { Shutdown(); }

void ClientServer::OnCapabilityInfo(const MasterSession::CapabilityInfo& info) {
  if (info.sealed_key != nullptr) {
    if (info.sealed_key->empty()) {
      Logger("client").error(
          "the master granted no capability key (does it run with --auth=false?): this data "
          "plane refuses every frame from peers");
      capabilities_->SetKey("");
    } else {
      absl::StatusOr<std::string> key =
          auth::UnwrapOwnerKey(*options_.cluster_keys, options_.client_id, *info.sealed_key);
      if (!key.ok()) {
        Logger("client").error("cannot open the master's capability key: {}",
                               std::string(key.status().message()));
      }
      capabilities_->SetKey(key.ok() ? *key : "");
    }
  }
  if (info.master_clock_ms != 0) {
    capabilities_->SetMasterClock(static_cast<int64_t>(info.master_clock_ms), info.sent_ms);
  }
}

absl::Status ClientServer::Start() {
  if (std::vector<std::string> problems = options_.Validate(); !problems.empty()) {
    return McError(Code::kInvalidArgument, absl::StrJoin(problems, "; "));
  }
  FillDefaults();
  MC_RETURN_IF_ERROR(OpenMemory());
  MC_RETURN_IF_ERROR(OpenDiskTier());
  TlsChannelFiles master_tls = options_.master_tls;
  if (master_tls.enabled()) {
    master_tls.cert_file = options_.tls.cert_file;  // our client certificate, when we have one
    master_tls.key_file = options_.tls.key_file;
  }
  MC_ASSIGN_OR_RETURN(ChannelSecurity master_security,
                      ChannelSecurity::Make(master_tls, {.ca = "--master_tls_ca_file"}));
  if (master_security.tls()) Logger("client").info("master calls over TLS ({})", options_.master);
  master_ = CreateGrpcMasterClient({.address = options_.master,
                                    .rpc_timeout_ms = options_.master_rpc_timeout_ms,
                                    .release_delay_us = options_.lease_release_delay_us,
                                    .pack_release_keys = options_.store.pack_master_keys,
                                    .cluster_keys = options_.cluster_keys,
                                    .security = std::move(master_security),
                                    .lane = options_.master_lane,
                                    .lane_connections = options_.master_lane_connections,
                                    .metrics = &registry_});
  MC_RETURN_IF_ERROR(StartDataPlane());  // its bound port is our endpoint
  MC_RETURN_IF_ERROR(StartTransferEngine());
  StartSession();
  BuildBatchPaths();
  BuildGpuPaths();
  MC_RETURN_IF_ERROR(StartFdChannel());
  store_->SetAccess(store_auth_.get(), fd_channel_.get());
  if (gpu_service_) gpu_service_->SetAccess(store_auth_.get(), fd_channel_.get());
  MC_RETURN_IF_ERROR(StartGrpc());
  MC_RETURN_IF_ERROR(StartFastChannel());
  MC_RETURN_IF_ERROR(StartAdmin());
  return AnnounceServing();
}

void ClientServer::FillDefaults() {
  if (!options_.listen.empty() && !options_.store_tcp_auth) {
    Logger("client").warn(
        "--store_tcp_auth=false: the Store service on {} answers anyone who can reach it "
        "(reads, writes and removes of every key)",
        options_.listen);
  }
  if (options_.fd_socket.empty() && !options_.unix_socket.empty()) {
    options_.fd_socket = options_.unix_socket + ".fd";
  }
  if (options_.host.empty()) options_.host = DefaultHost();
  if (options_.client_id.empty()) options_.client_id = DefaultClientId(options_.host);
}

absl::Status ClientServer::OpenMemory() {
  auto pool = SegmentPool::Create(options_.segments);
  if (!pool.ok()) return pool.status();
  pool_ = std::move(*pool);
  if (options_.object_index && !pool_->segments().empty()) {
    std::vector<uint64_t> sizes;
    for (const auto& seg : pool_->segments()) sizes.push_back(seg.size);
    index_ = std::make_unique<ObjectIndex>(
        std::move(sizes),
        &registry_.GetGauge("mc_client_index_objects", "objects in this daemon's object index"));
  }
  SegmentPool* pool_ptr = pool_.get();
  resolve_segment_ = [pool_ptr](uint64_t id) { return pool_ptr->LocalIndexOf(id); };
  return absl::OkStatus();
}

absl::Status ClientServer::StartDataPlane() {
  auto data = ParseHostPort(options_.data);
  if (!data.ok()) return data.status();
  transfer::tcp::TcpDataServerOptions data_opts = options_.data_server;
  data_opts.listen_address = options_.data;
  data_opts.metrics = &registry_;
  data_opts.socket_buffers = options_.transfer.tcp.socket_buffers;
  if (options_.cluster_keys != nullptr) {
    capabilities_ = std::make_unique<auth::CapabilityVerifier>(
        auth::CapabilityVerifierOptions{.clock_skew_ms = options_.capability_clock_skew_ms},
        RealClock::Get());
    data_opts.cluster_keys = options_.cluster_keys;
    data_opts.capabilities = capabilities_.get();
    data_opts.require_encryption = options_.transfer.tcp.encryption;
  }
  data_server_ = std::make_unique<transfer::tcp::TcpDataServer>(data_opts, segment_table_);
  if (index_) {
    index_handler_ = std::make_unique<IndexNoticeHandler>(*index_, resolve_segment_,
                                                          capabilities_.get(), registry_);
  }
  // The data plane's own ops go to their components, through the transport-neutral seam
  // (transfer/data_server.h). INDEX is served even without an index, so a writer that keeps one
  // learns (NOT_READY) rather than losing its connection to an unserved op.
  MC_RETURN_IF_ERROR(data_server_->RegisterOpHandler(
      transfer::DataOp::kIndex,
      [this](const transfer::DataRequest& request, transfer::RequestStream& stream) {
        if (index_handler_) return index_handler_->Serve(request, stream);
        return IndexNoticeHandler::ServeWithoutIndex(request, stream);
      }));
  if (tier_) {
    MC_RETURN_IF_ERROR(data_server_->RegisterOpHandler(
        transfer::DataOp::kReadDisk,
        [this](const transfer::DataRequest& request, transfer::RequestStream& stream) {
          return offload_->ServeReadDisk(request, stream);
        }));
  }
  MC_RETURN_IF_ERROR(engine_ops_.RegisterWith(*data_server_));
  MC_RETURN_IF_ERROR(data_server_->Start());
  auto bound = ParseHostPort(data_server_->endpoint());
  if (!bound.ok()) return bound.status();
  data_endpoint_ = absl::StrCat(
      options_.advertise_host.empty() ? data->host : options_.advertise_host, ":", bound->port);
  return absl::OkStatus();
}

absl::Status ClientServer::StartTransferEngine() {
  transfer::TransferEngineOptions engine_opts = options_.transfer;
  engine_opts.local_endpoint = data_endpoint_;
  engine_opts.metrics = &registry_;
  engine_opts.tcp.cluster_keys = options_.cluster_keys;
  if (options_.cluster_keys != nullptr && engine_opts.tcp.encryption &&
      engine_opts.transport == "auto") {
    // One-sided rdma is plaintext: with an encrypted data plane every remote transfer is tcp.
    engine_opts.transport = "tcp";
  }
  engine_ = std::make_unique<transfer::TransferEngine>(engine_opts, segment_table_);
  MC_RETURN_IF_ERROR(engine_->status());
  for (const auto& seg : pool_->segments()) {
    MC_RETURN_IF_ERROR(
        engine_->RegisterMemory(seg.base, seg.size, transfer::MemoryAccess::kRemote));
  }
  engine_ops_.Attach(engine_.get());  // segments registered: peers may connect now
  // Application buffers (staged from the fd channel, which starts later) get local-only
  // registrations where that changes how they move (rdma); the engine outlives buffers_.
  if (engine_->NeedsLocalRegistration()) buffers_.AttachRegistrar(engine_.get());
  return absl::OkStatus();
}

void ClientServer::StartSession() {
  uint64_t disk_capacity = tier_ ? tier_->GetStats().capacity : 0;
  session_ = std::make_unique<MasterSession>(MasterSessionOptions{.client_id = options_.client_id,
                                                                  .host = options_.host,
                                                                  .data_endpoint = data_endpoint_,
                                                                  .disk_capacity = disk_capacity,
                                                                  .retry_interval_ms = 500,
                                                                  .metrics = &registry_},
                                             *master_, *pool_, segment_table_);
  session_->SetObjectIndex(index_.get());
  if (capabilities_ != nullptr) {
    session_->SetOnCapabilityInfo(
        [this](const MasterSession::CapabilityInfo& info) { OnCapabilityInfo(info); });
  }
  if (tier_) {
    offload::DiskTier* tier = tier_.get();
    session_->SetDiskUsedFn([tier] { return tier->GetStats().used; });
    offload_ = std::make_unique<OffloadDriver>(
        OffloadDriverOptions{.client_id = options_.client_id,
                             .poll_interval_ms = options_.offload_poll_ms,
                             .parallelism = options_.offload_parallelism},
        *tier_, *master_, segment_table_, [this] { return session_->session(); }, registry_);
    session_->SetOnRegistered([this] { offload_->RequestReport(); });
  }
  absl::Status registered = session_->Start();
  if (!registered.ok()) {
    Logger("client").warn("cannot register with the master at {} yet ({}); retrying",
                          options_.master, registered.ToString());
  }
}

void ClientServer::BuildBatchPaths() {
  prefix_leases_ = std::make_unique<PrefixLeases>(RealClock::Get());
  holder_backoff_ = std::make_unique<HolderBackoff>(RealClock::Get(), options_.holder_backoff_ms);
  putter_ = std::make_unique<BatchPutter>(
      BatchPutOptions{.client_id = options_.client_id,
                      .max_replicas = 8,
                      .no_space_wait_ms = options_.put_no_space_wait_ms,
                      .write_timeout_ms = options_.put_write_timeout_ms,
                      .write_back_wait_ms = options_.put_write_back_wait_ms},
      *master_, *engine_, RealClock::Get(), metrics_);
  putter_->SetHolderBackoff(holder_backoff_.get());
  if (options_.object_index) {
    notifier_ = std::make_unique<IndexNotifier>(data_endpoint_, index_.get(), resolve_segment_,
                                                *engine_, registry_);
    putter_->SetIndexNotifier(notifier_.get());
  }
  BatchGetOptions get_options{options_.client_id, data_endpoint_, options_.get_lease_ttl_ms, 8};
  get_options.pack_master_keys = options_.store.pack_master_keys;
  getter_ = std::make_unique<BatchGetter>(std::move(get_options), *master_, *engine_,
                                          *prefix_leases_, RealClock::Get(), metrics_);
  getter_->SetHolderBackoff(holder_backoff_.get());
  if (options_.get_speculative_local && index_) {
    SpeculationSource source{
        .index = index_.get(),
        .segments = {},
        .resolve = resolve_segment_,
        .max_job_bytes = options_.get_speculative_max_bytes,
        .max_job_keys = static_cast<size_t>(options_.get_speculative_max_keys)};
    for (const auto& seg : pool_->segments()) source.segments.push_back({seg.base, seg.size});
    getter_->SetSpeculation(std::move(source));
  }
  if (offload_) {
    getter_->SetDiskReader(offload_.get());
    offload_->Start();
  }
  if (options_.promote_on_hit) {
    promoter_ = std::make_unique<Promoter>(options_.client_id, *master_, *engine_, RealClock::Get(),
                                           registry_, options_.promote_staging_bytes);
    promoter_->SetIndexNotifier(notifier_.get());
    getter_->SetPromoter(promoter_.get());
  }
  options_.store.client_id = options_.client_id;
  store_ =
      std::make_unique<StoreGrpcService>(options_.store, buffers_, *putter_, *getter_, *master_,
                                         *prefix_leases_, RealClock::Get(), metrics_);
  store_auth_ = std::make_unique<StoreAuth>(
      StoreAuthOptions{.token = options_.store_token, .tcp_auth = options_.store_tcp_auth},
      registry_);
}

void ClientServer::BuildGpuPaths() {
  transfer::GpuTransfers* gpu = engine_->gpu();
  if (gpu == nullptr) {
    if (options_.transfer.cuda.device >= 0) {
      Logger("client").error(
          "--cuda_device={} asked for, but there is no cuda transport (see the transfer log "
          "above): GpuBuffers is not served and GPU slices are refused",
          options_.transfer.cuda.device);
    }
    return;
  }
  // GPU buffers: served next to Store, admitted exactly as Store's callers (docs/gpu.md), and
  // released with their fd session as its shm buffers are (StartFdChannel).
  gpu_buffers_ = std::make_unique<GpuBufferRegistry>(gpu->api(), gpu, options_.gpu_max_buffers,
                                                     options_.gpu_max_buffers_per_caller);
  gpu_service_ = std::make_unique<GpuBufferService>(*gpu_buffers_, gpu->api());
  gpu_put_stager_ = std::make_unique<GpuPutStager>(gpu->api(), gpu->mover(), options_.gpu_put,
                                                   RealClock::Get(), gpu);
  store_->SetGpuBuffers(gpu_buffers_.get(), gpu_put_stager_.get());
  putter_->SetGpuStager(gpu_put_stager_.get());
  gpu_get_stager_ =
      std::make_unique<GpuGetStager>(gpu->api(), gpu->mover(), options_.gpu_get, RealClock::Get());
  getter_->SetGpuStager(gpu_get_stager_.get());
}

absl::Status ClientServer::AnnounceServing() {
  if (!options_.ready_file.empty()) {
    MC_RETURN_IF_ERROR(WriteReadyFile(options_.ready_file, {{"grpc", grpc_address_},
                                                            {"http", http_address_},
                                                            {"data", data_endpoint_},
                                                            {"unix_socket", options_.unix_socket},
                                                            {"fd_socket", options_.fd_socket},
                                                            {"fast_socket", fast_socket_},
                                                            {"client_id", options_.client_id}}));
  }
  Logger("client").info("mc-client {} serving Store on {}{}, data plane on {}, HTTP on {}",
                        options_.client_id, grpc_address_.empty() ? "(no TCP)" : grpc_address_,
                        options_.unix_socket.empty() ? "" : " and unix:" + options_.unix_socket,
                        data_endpoint_, http_address_.empty() ? "(off)" : http_address_);
  if (options_.cluster_keys != nullptr) {
    const auto& member = options_.cluster_keys->member();
    Logger("client").info("authenticated{} (cluster secret fingerprint {}, {} secret(s))",
                          member ? absl::StrCat(" with the member credential of ",
                                                member->client_id, " serial ", member->serial)
                                 : std::string(" with the cluster secret"),
                          options_.cluster_keys->fingerprint(),
                          options_.cluster_keys->secret_count());
  } else {
    Logger("client").warn(
        "NOT authenticated (--auth=false): any process that can reach the data "
        "plane at {} may read or write its segments",
        data_endpoint_);
  }
  return absl::OkStatus();
}

absl::Status ClientServer::OpenDiskTier() {
  if (options_.offload.dir.empty()) return absl::OkStatus();
  offload::DiskTierOptions opts = options_.offload;
  opts.metrics = &registry_;
  // The tier reclaims a record only once the master dropped its DISK replica (never while
  // a reader holds a lease). Until the driver exists, nothing may go.
  opts.reclaim_guard = [this](const std::vector<offload::DiskTierVictim>& victims) {
    return offload_ ? offload_->MayReclaim(victims) : std::vector<bool>(victims.size(), false);
  };
  auto tier = offload::DiskTier::Open(std::move(opts));
  if (!tier.ok()) return tier.status();
  tier_ = std::move(*tier);
  offload::DiskTier::Stats stats = tier_->GetStats();
  Logger("client").info("SSD tier in {}: {} used of {}, {} record(s) recovered, {} skipped ({})",
                        options_.offload.dir, FormatBytes(stats.used), FormatBytes(stats.capacity),
                        stats.records_recovered, stats.records_skipped_corrupt,
                        tier_->io_engine_name());
  return absl::OkStatus();
}

absl::Status ClientServer::StartFdChannel() {
  if (options_.fd_socket.empty()) return absl::OkStatus();
  FdChannelOptions opts = options_.fd_channel;
  opts.path = options_.fd_socket;
  opts.mode = options_.unix_socket_mode;
  opts.group = options_.unix_socket_group;
  fd_channel_ = std::make_unique<FdChannelServer>(opts, buffers_, registry_);
  if (gpu_buffers_) {
    fd_channel_->AddSessionEndHook(
        [gpu = gpu_buffers_.get()](const std::string& owner) { return gpu->ReleaseOwner(owner); });
    // POSIX-fd GPU handles come over this channel and wait for RegisterGpuBuffer.
    gpu_fd_tickets_ = std::make_unique<GpuFdTickets>();
    fd_channel_->SetGpuFdTickets(gpu_fd_tickets_.get());
    fd_channel_->AddSessionEndHook([tickets = gpu_fd_tickets_.get()](const std::string& owner) {
      return tickets->ReleaseOwner(owner);
    });
    gpu_service_->SetFdTickets(gpu_fd_tickets_.get());
  }
  return fd_channel_->Start();
}

absl::Status ClientServer::StartFastChannel() {
  if (options_.unix_socket.empty() || !options_.store_fast_channel) return absl::OkStatus();
  FastChannelOptions opts = options_.fast_channel;
  opts.path = options_.unix_socket + ".fast";
  opts.mode = options_.unix_socket_mode;
  opts.group = options_.unix_socket_group;
  fast_channel_ = std::make_unique<FastChannelServer>(opts, *store_, fd_channel_.get(), registry_);
  if (absl::Status s = fast_channel_->Start(); !s.ok()) {
    // gRPC serves every call the fast channel would: run on without it (e.g. a socket path
    // that fits with ".fd" but not with ".fast").
    Logger("client").error("fast channel off, Store calls go over gRPC only: {}", s.ToString());
    fast_channel_->Stop();  // kept: the metrics registry still reads its gauge
    return absl::OkStatus();
  }
  fast_socket_ = opts.path;
  return absl::OkStatus();
}

absl::Status ClientServer::StartGrpc() {
  if (options_.listen.empty() && options_.unix_socket.empty()) {
    Logger("client").warn("no --listen and no --unix_socket: the Store service is off");
    return absl::OkStatus();
  }
  grpc::ServerBuilder builder;
  int port = 0;
  if (!options_.listen.empty()) {
    MC_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                        MakeServerCredentials(options_.tls));
    if (options_.tls.enabled()) {
      Logger("client").info(
          "Store listener {} serves TLS{}", options_.listen,
          options_.tls.client_ca_file.empty() ? "" : " (client certificates required)");
    }
    builder.AddListeningPort(options_.listen, credentials, &port);
  }
  if (!options_.unix_socket.empty()) {
    // sockaddr_un::sun_path holds 107 bytes and a NUL; gRPC would fail without saying why.
    if (options_.unix_socket.size() > 107) {
      return McError(Code::kInvalidArgument,
                     absl::StrCat("--unix_socket path of ", options_.unix_socket.size(),
                                  " bytes exceeds the 107 a Unix socket path may have: ",
                                  options_.unix_socket));
    }
    unlink(options_.unix_socket.c_str());  // a stale socket from a previous run
    builder.AddListeningPort("unix:" + options_.unix_socket, grpc::InsecureServerCredentials());
  }
  // Room for one inline payload at the limit plus its envelope; larger messages are refused.
  int max_message =
      static_cast<int>(std::min<uint64_t>(options_.store.max_inline_bytes + (1 << 20), INT32_MAX));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  MC_RETURN_IF_ERROR(SetGrpcHandshakeTimeout(builder, options_.grpc_handshake_timeout_ms));
  builder.RegisterService(store_.get());
  if (gpu_service_) builder.RegisterService(gpu_service_.get());
  // gRPC binds the Unix socket with the process umask: nobody else may connect until the mode
  // and group below are in place. (Startup is the only time the daemon creates files.)
  mode_t old_mask = umask(0177);
  grpc_server_ = builder.BuildAndStart();
  umask(old_mask);
  if (grpc_server_ && !options_.unix_socket.empty()) {
    MC_RETURN_IF_ERROR(ApplySocketPermissions(options_.unix_socket, options_.unix_socket_mode,
                                              options_.unix_socket_group));
  }
  if (!grpc_server_ || (!options_.listen.empty() && port == 0)) {
    return McError(Code::kUnavailable, absl::StrCat("cannot serve Store on ", options_.listen, " ",
                                                    options_.unix_socket));
  }
  if (!options_.listen.empty()) {
    auto hp = ParseHostPort(options_.listen);
    if (!hp.ok()) return hp.status();
    grpc_address_ = absl::StrCat(hp->host, ":", port);
  }
  return absl::OkStatus();
}

std::string ClientServer::StatusLine() {
  uint64_t capacity = 0;
  for (const auto& s : pool_->segments()) capacity += s.size;
  std::string ssd = "off";
  if (tier_) {
    offload::DiskTier::Stats st = tier_->GetStats();
    ssd = absl::StrFormat("%s / %s, %d records", FormatBytes(st.used), FormatBytes(st.capacity),
                          st.records);
  }
  return absl::StrFormat(
      "Client %s | Registered: %s | Segments: %d (%s) | Data: %s | Buffers: %d | Leases: %d | "
      "SSD Storage: %s",
      options_.client_id, session_->registered() ? "yes" : "no", pool_->segments().size(),
      FormatBytes(capacity), data_endpoint_, buffers_.Count(), prefix_leases_->Count(), ssd);
}

absl::Status ClientServer::StartAdmin() {
  if (options_.http.empty()) return absl::OkStatus();
  auto hp = ParseHostPort(options_.http);
  if (!hp.ok()) return hp.status();
  AdminServerOptions admin_opts = options_.admin;
  admin_opts.host = hp->host;
  admin_opts.port = hp->port;
  admin_opts.metrics = &registry_;
  admin_ = std::make_unique<AdminServer>(admin_opts);
  registry_.AddCallbackGauge("mc_client_registered", "1 while registered with the master",
                             [this] { return session_->registered() ? 1.0 : 0.0; });
  registry_.AddCallbackGauge("mc_client_registrations", "Registrations with the master so far",
                             [this] { return static_cast<double>(session_->registrations()); });
  registry_.AddCallbackGauge(
      "mc_client_prefix_leases",
      "Prefix leases (MatchPrefix) held by applications now (expired ones until pruned)",
      [this] { return static_cast<double>(prefix_leases_->Count()); });
  registry_.AddCallbackGauge("mc_client_buffers", "Registered application buffers",
                             [this] { return static_cast<double>(buffers_.Count()); });
  registry_.AddCallbackGauge(
      "mc_client_buffer_rdma_bytes",
      "Bytes of registered application buffers that are rdma memory regions (local access only)",
      [this] { return static_cast<double>(buffers_.RdmaBytes()); });
  registry_.AddCallbackGauge(
      "mc_client_buffer_rdma_refusals_total",
      "Application buffers not registered with rdma (--rdma_buffer_bytes_total or the device "
      "refused); their transfers use tcp",
      [this] { return static_cast<double>(buffers_.RdmaRefusals()); });
  registry_.AddCallbackGauge(
      "mc_client_buffer_faults_total",
      "SIGBUS faults absorbed in registered buffers whose shm object was truncated while mapped",
      [] { return static_cast<double>(BufferFaultsAbsorbed()); });
  admin_->Handle("/metrics", "text/plain; version=0.0.4",
                 [this] { return registry_.RenderPrometheus(); });
  admin_->Handle("/status", "text/plain", [this] { return StatusLine() + "\n"; });
  for (const char* path : {"/status.html", "/"}) {
    admin_->Handle(path, "text/html; charset=utf-8",
                   [this] { return ClientStatusHtml(StatusLine(), registry_); });
  }
  // Unhealthy while the data plane cannot accept connections (e.g. at the fd limit): peers'
  // reads from us fail then, and an orchestrator should know.
  admin_->HandleReply("/healthz", "text/plain", [this] {
    absl::Status data = data_server_ ? data_server_->Health() : absl::OkStatus();
    if (!data.ok())
      return AdminServer::Reply{503, absl::StrCat("unhealthy: ", data.message(), "\n")};
    return AdminServer::Reply{200, "ok\n"};
  });
  auto bound = admin_->Start();
  if (!bound.ok()) return bound.status();
  http_address_ = *bound;
  return absl::OkStatus();
}

void ClientServer::Shutdown() {
  if (stopped_) return;
  stopped_ = true;
  if (grpc_server_) {
    grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  if (fast_channel_) fast_channel_->Stop();
  if (fd_channel_) fd_channel_->Stop();
  if (offload_) offload_->Stop();
  if (session_) session_->Stop();
  if (data_server_) data_server_->Stop();
  if (admin_) admin_->Stop();
  if (!options_.unix_socket.empty()) unlink(options_.unix_socket.c_str());
}

}  // namespace mc::client
