#include "master/grpc_service.h"

#include <chrono>
#include <iterator>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/master_credentials.h"
#include "common/rpc_scope.h"
#include "master/grpc_answers.h"
#include "proto/packed_lookups.h"
#include "proto/status_convert.h"

namespace mc::master {

namespace v1 = mcstore::v1;

namespace {

// An RPC's answer, counted as a failure unless OK.
template <typename Metrics>
grpc::Status Counted(RpcScope<Metrics>& scope, grpc::Status status) {
  if (!status.ok()) scope.metrics().failures.Inc();
  return status;
}

// PutStartRequest.avoid_clients taken into account (a bound on the placement cost of a request).
constexpr size_t kMaxAvoidedClients = 16;

// How many items a request carries, for the batch limit (0 for requests that are not batches).
template <typename Req>
size_t BatchItems(const Req& req) {
  if constexpr (requires { req.failed_size(); }) {  // AddDiskReplicas: both lists count
    return static_cast<size_t>(req.items_size()) + static_cast<size_t>(req.failed_size());
  } else if constexpr (requires { req.items_size(); }) {
    return static_cast<size_t>(req.items_size());
  } else if constexpr (requires { req.packed_key_sizes_size(); }) {
    return static_cast<size_t>(req.keys_size()) + static_cast<size_t>(req.packed_key_sizes_size());
  } else if constexpr (requires { req.keys_size(); }) {
    return static_cast<size_t>(req.keys_size());
  } else {
    return 0;
  }
}

}  // namespace

namespace {

// The one value of metadata `key`: nullopt when absent; `*repeated` when sent more than once
// (refused: which one would count is ambiguous).
std::optional<std::string_view> MetadataValue(const grpc::CallbackServerContext& ctx,
                                              const char* key, bool* repeated) {
  const auto& md = ctx.client_metadata();
  auto [begin, end] = md.equal_range(grpc::string_ref(key));
  if (begin == end) return std::nullopt;
  if (std::next(begin) != end) *repeated = true;
  return std::string_view(begin->second.data(), begin->second.size());
}

}  // namespace

grpc::Status MasterGrpcService::Refuse(const char* rpc, AuthFailure reason,
                                       const absl::Status& why) {
  auth_->CountFailure(rpc, reason, std::string(why.message()));
  const grpc::StatusCode code =
      reason == AuthFailure::kWrongClient || reason == AuthFailure::kWrongRole ||
              reason == AuthFailure::kRevoked
          ? grpc::StatusCode::PERMISSION_DENIED
      : reason == AuthFailure::kRevocationUnreadable ? grpc::StatusCode::UNAVAILABLE
                                                     : grpc::StatusCode::UNAUTHENTICATED;
  return grpc::Status(code, std::string(why.message()));
}

template <typename Req>
grpc::Status MasterGrpcService::Authenticate(const CallCredentials& credentials, const char* rpc,
                                             const Req& req, Caller* caller) {
  if (auth_ == nullptr) return grpc::Status::OK;  // Caller::Kind::kAnyone
  // Hello needs no credential: it answers what every proof must name.
  if constexpr (std::is_same_v<Req, v1::HelloRequest>) return grpc::Status::OK;
  const std::optional<std::string_view>& proof = credentials.proof;
  const std::optional<std::string_view>& session = credentials.session;
  if (credentials.repeated) {
    return Refuse(rpc, AuthFailure::kMalformed,
                  absl::UnauthenticatedError("a credential header is repeated"));
  }
  absl::StatusOr<auth::SessionCredential> credential;
  if (session) credential = auth::ParseSessionCredential(*session);
  if (session && !credential.ok()) {
    return Refuse(rpc, AuthFailure::kMalformed,
                  absl::UnauthenticatedError(
                      absl::StrCat("malformed x-mc-session: ", credential.status().message())));
  }
  AuthFailure reason = AuthFailure::kMissing;
  if constexpr (std::is_same_v<Req, v1::RegisterClientRequest>) {
    if (!proof) {
      return Refuse(rpc, AuthFailure::kMissing,
                    absl::UnauthenticatedError("RegisterClient needs an x-mc-auth proof"));
    }
    // A cluster-secret proof, or a member proof for this very client id (fills in the member
    // fields of `caller`).
    absl::Status s = auth_->CheckProof(*proof, auth::ProofRole::kRegister, req.client_id(),
                                       req.data_endpoint(), &reason, caller);
    if (!s.ok()) return Refuse(rpc, reason, s);
    caller->kind = Caller::Kind::kRegistrant;
    caller->client_id = req.client_id();
    // The token of the session it replaces, if it names one of its own: checked against the
    // live session under the registration lock (ClientLifecycle::RegisterClient).
    if (credential.ok() && credential->client_id == req.client_id()) {
      caller->previous_token = std::move(credential->token);
    }
    return grpc::Status::OK;
  } else {
    if constexpr (std::is_same_v<Req, v1::GetStatusRequest>) {
      if (proof) {
        absl::StatusOr<auth::ParsedProof> parsed = auth::ParseProof(*proof);
        absl::Status s = parsed.ok() ? auth_->CheckProof(*proof, auth::ProofRole::kAdmin,
                                                         parsed->id, "", &reason)
                                     : absl::UnauthenticatedError(absl::StrCat(
                                           "malformed x-mc-auth: ", parsed.status().message()));
        if (!parsed.ok()) reason = AuthFailure::kMalformed;
        if (!s.ok()) return Refuse(rpc, reason, s);
        caller->kind = Caller::Kind::kAdmin;
        caller->client_id = parsed->id;
        return grpc::Status::OK;
      }
    }
    if (!session) {
      return Refuse(
          rpc, AuthFailure::kMissing,
          absl::UnauthenticatedError(absl::StrCat(rpc, " needs x-mc-session (register first)")));
    }
    std::optional<uint64_t> number = service_.SessionOf(credential->client_id, credential->token);
    if (!number) {
      return Refuse(rpc, AuthFailure::kUnknownSession,
                    absl::UnauthenticatedError(
                        "unknown or expired session (the master restarted or dropped this "
                        "client): register again"));
    }
    if constexpr (requires { req.client_id(); }) {
      if (!req.client_id().empty() && req.client_id() != credential->client_id) {
        return Refuse(rpc, AuthFailure::kWrongClient,
                      absl::PermissionDeniedError(
                          "the request names another client than the caller's session"));
      }
    }
    caller->kind = Caller::Kind::kClient;
    caller->client_id = std::move(credential->client_id);
    caller->session = *number;
    return grpc::Status::OK;
  }
}

template <typename Req, typename Resp>
grpc::Status MasterGrpcService::Answer(const char* rpc, const CallCredentials& credentials,
                                       const Req& req, Resp* resp, Handler<Req, Resp> handler,
                                       std::string* leader) {
  RpcScope scope(MetricsFor(rpc));
  if (gate_ != nullptr && !gate_->Serving()) {
    *leader = gate_->LeaderAddress();
    return Counted(scope, grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                       absl::StrCat("mc-master standby; leader is ",
                                                    leader->empty() ? "unknown" : *leader)));
  }
  Caller caller;
  grpc::Status status = Authenticate(credentials, rpc, req, &caller);
  if (status.ok()) {
    const size_t items = BatchItems(req);
    status = items > max_batch_items_ ? ToGrpcStatus(TooManyItems(items, max_batch_items_))
                                      : (this->*handler)(caller, &req, resp);
  }
  return Counted(scope, std::move(status));
}

template <typename Req, typename Resp>
grpc::ServerUnaryReactor* MasterGrpcService::Serve(grpc::CallbackServerContext* ctx,
                                                   const char* rpc, const Req* req, Resp* resp,
                                                   Handler<Req, Resp> handler) {
  CallCredentials credentials;
  credentials.proof = MetadataValue(*ctx, auth::kProofHeader, &credentials.repeated);
  credentials.session = MetadataValue(*ctx, auth::kSessionHeader, &credentials.repeated);
  std::string leader;
  grpc::Status status = Answer(rpc, credentials, *req, resp, handler, &leader);
  if (!leader.empty()) ctx->AddTrailingMetadata(auth::kLeaderHeader, leader);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(std::move(status));
  return reactor;
}

#define MC_MASTER_SERVE(Rpc)                                                                    \
  grpc::ServerUnaryReactor* MasterGrpcService::Rpc(                                             \
      grpc::CallbackServerContext* ctx, const v1::Rpc##Request* req, v1::Rpc##Response* resp) { \
    return Serve(ctx, #Rpc, req, resp, &MasterGrpcService::Do##Rpc);                            \
  }
MC_MASTER_SERVE(RegisterClient)
MC_MASTER_SERVE(Heartbeat)
MC_MASTER_SERVE(UnregisterClient)
MC_MASTER_SERVE(PutStart)
MC_MASTER_SERVE(PutEnd)
MC_MASTER_SERVE(PutRevoke)
MC_MASTER_SERVE(GetReplicas)
MC_MASTER_SERVE(ReleaseLeases)
MC_MASTER_SERVE(Exist)
MC_MASTER_SERVE(Remove)
MC_MASTER_SERVE(AddDiskReplicas)
MC_MASTER_SERVE(RemoveDiskReplicas)
MC_MASTER_SERVE(PromoteStart)
MC_MASTER_SERVE(PromoteEnd)
MC_MASTER_SERVE(TakeOffloadTasks)
MC_MASTER_SERVE(GetStatus)
MC_MASTER_SERVE(Hello)
MC_MASTER_SERVE(ReportObjects)
MC_MASTER_SERVE(ReportReplicaFaults)
#undef MC_MASTER_SERVE

#define MC_MASTER_LANE(Rpc)                                                                       \
  grpc::Status MasterGrpcService::Lane##Rpc(const CallCredentials& credentials,                   \
                                            const v1::Rpc##Request& req, v1::Rpc##Response* resp, \
                                            std::string* leader) {                                \
    return Answer(#Rpc, credentials, req, resp, &MasterGrpcService::Do##Rpc, leader);             \
  }
MC_MASTER_LANE(GetReplicas)
MC_MASTER_LANE(ReleaseLeases)
MC_MASTER_LANE(PutStart)
MC_MASTER_LANE(PutEnd)
MC_MASTER_LANE(PutRevoke)
MC_MASTER_LANE(Exist)
MC_MASTER_LANE(Remove)
#undef MC_MASTER_LANE

MasterGrpcService::MasterGrpcService(MasterApi& service, MetricsRegistry& metrics,
                                     size_t max_batch_items, RpcAuthenticator* auth)
    : service_(service), metrics_(metrics), max_batch_items_(max_batch_items), auth_(auth) {
  SetMessageAllocatorFor_GetReplicas(&get_replicas_alloc_);
  SetMessageAllocatorFor_ReleaseLeases(&release_leases_alloc_);
  SetMessageAllocatorFor_Exist(&exist_alloc_);
  SetMessageAllocatorFor_Remove(&remove_alloc_);
  SetMessageAllocatorFor_PutStart(&put_start_alloc_);
  SetMessageAllocatorFor_PutEnd(&put_end_alloc_);
}

MasterGrpcService::RpcMetrics& MasterGrpcService::MetricsFor(const char* rpc) {
  {
    absl::ReaderMutexLock lock(&rpc_metrics_mu_);
    auto it = rpc_metrics_.find(rpc);
    if (it != rpc_metrics_.end()) return *it->second;
  }
  absl::MutexLock lock(&rpc_metrics_mu_);
  auto& slot = rpc_metrics_[rpc];
  if (!slot) {
    slot = std::make_unique<RpcMetrics>(RpcMetrics{
        metrics_.GetCounter("mc_master_rpc_requests_total", "Master RPCs received", {{"rpc", rpc}}),
        metrics_.GetCounter("mc_master_rpc_failures_total", "Master RPCs that failed as a whole",
                            {{"rpc", rpc}}),
        metrics_.GetHistogram("mc_master_rpc_latency_seconds", "Master RPC latency",
                              {{"rpc", rpc}})});
  }
  return *slot;
}

namespace {

// The client a handler acts as: the authenticated caller, or with authentication off whatever
// the request says.
template <typename Req>
const std::string& Self(const Caller& caller, const Req& req) {
  return caller.authenticated() ? caller.client_id : req.client_id();
}

template <typename Repeated>
std::vector<std::string_view> Keys(const Repeated& keys) {
  return std::vector<std::string_view>(keys.begin(), keys.end());
}

}  // namespace

grpc::Status MasterGrpcService::DoRegisterClient(const Caller& caller,
                                                 const v1::RegisterClientRequest* req,
                                                 v1::RegisterClientResponse* resp) {
  ClientInfo info;
  info.client_id = Self(caller, *req);
  info.host = req->host();
  info.endpoint = req->data_endpoint();
  info.disk_capacity = req->disk_capacity();
  info.disk_used = req->disk_used();
  std::vector<uint64_t> sizes;
  for (const auto& seg : req->segments()) sizes.push_back(seg.size());
  const bool bound = caller.kind == Caller::Kind::kRegistrant;
  auto reg = service_.RegisterClient(info, sizes, RegistrationAuth{bound, caller.previous_token},
                                     req->will_report_objects());
  if (!reg.ok()) return ToGrpcStatus(reg.status());
  resp->set_session(reg->session);
  resp->set_epoch(reg->epoch);
  if (bound) resp->set_session_token(reg->token);
  for (uint64_t id : reg->segment_ids) resp->add_segment_ids(id);
  resp->set_heartbeat_interval_ms(service_.options().heartbeat_interval_ms);
  resp->set_client_ttl_ms(service_.options().client_ttl_ms);
  resp->set_lane_port(static_cast<uint32_t>(lane_port_));
  if (minter_ != nullptr) {
    // A member's owner key is wrapped under its own member key: no other member can open it.
    resp->set_capability_key(
        minter_->Register(req->client_id(), reg->session, caller.wrap_keys.get()));
    resp->set_capability_clock_ms(static_cast<uint64_t>(minter_->NowMs()));
  }
  if (bound && auth_ != nullptr) {
    auth_->NoteRegistration(caller.client_id, reg->session, caller.member, caller.member_serial);
  }
  return grpc::Status::OK;
}

grpc::Status MasterGrpcService::DoHeartbeat(const Caller& caller, const v1::HeartbeatRequest* req,
                                            v1::HeartbeatResponse* resp) {
  std::vector<ReplicaRef> forgotten;
  bool more = false;
  resp->set_known(
      service_.Heartbeat(Self(caller, *req), req->session(), req->disk_used(), &forgotten, &more));
  resp->mutable_forgotten()->Reserve(static_cast<int>(forgotten.size()));
  for (const ReplicaRef& ref : forgotten) {
    v1::ReplicaRef* out = resp->add_forgotten();
    out->set_segment_id(ref.segment_id);
    out->set_offset(ref.offset);
    out->set_generation(ref.generation);
  }
  resp->set_more_forgotten(more);
  if (minter_ != nullptr) resp->set_capability_clock_ms(static_cast<uint64_t>(minter_->NowMs()));
  return grpc::Status::OK;
}

grpc::Status MasterGrpcService::DoUnregisterClient(const Caller& caller,
                                                   const v1::UnregisterClientRequest* req,
                                                   v1::UnregisterClientResponse*) {
  const std::string& self = Self(caller, *req);
  absl::Status s = service_.UnregisterClient(self, req->session());
  if (s.ok() && minter_ != nullptr) minter_->Forget(self);
  return ToGrpcStatus(s);
}

grpc::Status MasterGrpcService::DoPutStart(const Caller& caller, const v1::PutStartRequest* req,
                                           v1::PutStartResponse* resp) {
  std::vector<PutStartItem> items;
  for (const auto& item : req->items()) items.push_back({item.key(), item.size()});
  const int64_t write_deadline_ms = service_.options().put_timeout_ms / 2;
  const std::vector<std::string_view> keys = ItemKeys(items);
  const Grants grants = WriteGrants(minter_, write_deadline_ms, keys);
  std::vector<std::string> avoid;
  for (const std::string& client : req->avoid_clients()) {
    if (avoid.size() == kMaxAvoidedClients) break;
    avoid.push_back(client);
  }
  AddPlacements(service_.PutStart(Self(caller, *req), items, req->replicas(), avoid),
                write_deadline_ms, grants, resp);
  return grpc::Status::OK;
}

grpc::Status MasterGrpcService::DoPutEnd(const Caller& caller, const v1::PutEndRequest* req,
                                         v1::PutEndResponse* resp) {
  std::vector<PutEndItem> items;
  for (const auto& item : req->items()) {
    items.push_back({item.key(), item.generation(), item.checksum()});
  }
  AddResults(service_.PutEnd(Self(caller, *req), items), resp);
  return grpc::Status::OK;
}

grpc::Status MasterGrpcService::DoPutRevoke(const Caller& caller, const v1::PutRevokeRequest* req,
                                            v1::PutRevokeResponse* resp) {
  std::vector<PutRevokeItem> items;
  for (const auto& item : req->items()) items.push_back({item.key(), item.generation()});
  AddResults(service_.PutRevoke(Self(caller, *req), items), resp);
  return grpc::Status::OK;
}

grpc::Status MasterGrpcService::DoGetReplicas(const Caller& caller,
                                              const v1::GetReplicasRequest* req,
                                              v1::GetReplicasResponse* resp) {
  // Releases first, whatever becomes of the lookup: they stand for earlier, finished reads. A
  // malformed one (keys named both ways, sizes that do not fit) is skipped and not counted in
  // releases_seen, which tells the caller.
  uint32_t releases_seen = 0;
  for (const v1::ReleaseLeasesRequest& release : req->releases()) {
    absl::StatusOr<std::vector<std::string_view>> released = RequestKeys(release);
    if (!released.ok()) continue;
    service_.ReleaseLeases(release.lease_id(), *released, caller.session);
    releases_seen += static_cast<uint32_t>(released->size());
  }
  resp->set_releases_seen(releases_seen);
  if (req->count_only() && !(req->stop_at_first_miss() && req->no_lease())) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "count_only needs stop_at_first_miss and no_lease");
  }
  LookupOptions options{.lease_ttl_ms = req->lease_ttl_ms(),
                        .stop_at_first_miss = req->stop_at_first_miss(),
                        .grant_lease = !req->no_lease(),
                        .with_replicas = !req->count_only(),
                        .touch = !req->count_only(),
                        .lease_owner = caller.session};
  absl::StatusOr<std::vector<std::string_view>> keys = RequestKeys(*req);
  if (!keys.ok()) return ToGrpcStatus(keys.status());
  // Read grants expire with the lease: counted from before the lookup granted it.
  const int64_t granted_at = minter_ != nullptr ? minter_->NowMs() : 0;
  LookupBatch batch = service_.GetReplicas(*keys, options);
  Grants grants;
  if (minter_ != nullptr && options.grant_lease && batch.lease_id != 0) {
    // A daemon reads the replicas it holds itself without a grant (its local copy and SSD
    // tier, never its data plane): none is minted for them, ~0.2 us of MAC each.
    grants = {.minter = minter_,
              .right = auth::Right::kRead,
              .expiry_ms = granted_at + batch.lease_ttl_ms,
              .keys = *keys,
              .self = caller.kind == Caller::Kind::kClient ? std::string_view(caller.client_id)
                                                           : std::string_view()};
  }
  resp->set_keys_seen(static_cast<uint32_t>(keys->size()));
  resp->set_lease_id(batch.lease_id);
  resp->set_lease_ttl_ms(batch.lease_ttl_ms);
  if (req->stop_at_first_miss()) {
    uint32_t matched = 0;
    while (matched < batch.results.size() && batch.results[matched].status.ok()) ++matched;
    resp->set_matched(matched);
    if (req->count_only()) return grpc::Status::OK;
  }
  if (req->packed()) {
    AddColumns(batch.results, grants, resp->mutable_packed());
  } else {
    AddRecords(batch.results, grants, resp);
  }
  return grpc::Status::OK;
}

grpc::Status MasterGrpcService::DoReleaseLeases(const Caller& caller,
                                                const v1::ReleaseLeasesRequest* req,
                                                v1::ReleaseLeasesResponse* resp) {
  absl::StatusOr<std::vector<std::string_view>> keys = RequestKeys(*req);
  if (!keys.ok()) return ToGrpcStatus(keys.status());
  resp->set_released(service_.ReleaseLeases(req->lease_id(), *keys, caller.session));
  resp->set_keys_seen(static_cast<uint32_t>(keys->size()));
  return grpc::Status::OK;
}

grpc::Status MasterGrpcService::DoExist(const Caller&, const v1::ExistRequest* req,
                                        v1::ExistResponse* resp) {
  for (bool e : service_.Exist(Keys(req->keys()))) resp->add_exists(e);
  return grpc::Status::OK;
}

grpc::Status MasterGrpcService::DoRemove(const Caller&, const v1::RemoveRequest* req,
                                         v1::RemoveResponse* resp) {
  AddResults(service_.Remove(Keys(req->keys())), resp);
  return grpc::Status::OK;
}

grpc::Status MasterGrpcService::DoAddDiskReplicas(const Caller& caller,
                                                  const v1::AddDiskReplicasRequest* req,
                                                  v1::AddDiskReplicasResponse* resp) {
  AddResults(service_.AddDiskReplicas(Self(caller, *req), DiskItems(req->items()), req->recovered(),
                                      DiskItems(req->failed())),
             resp);
  return grpc::Status::OK;
}

grpc::Status MasterGrpcService::DoRemoveDiskReplicas(const Caller& caller,
                                                     const v1::RemoveDiskReplicasRequest* req,
                                                     v1::RemoveDiskReplicasResponse* resp) {
  AddResults(
      service_.RemoveDiskReplicas(Self(caller, *req), DiskItems(req->items()), req->corrupt()),
      resp);
  return grpc::Status::OK;
}

grpc::Status MasterGrpcService::DoPromoteStart(const Caller& caller,
                                               const v1::PromoteStartRequest* req,
                                               v1::PromoteStartResponse* resp) {
  std::vector<PromoteItem> items;
  for (const auto& item : req->items()) items.push_back({item.key(), item.generation()});
  const int64_t write_deadline_ms = service_.options().put_timeout_ms / 2;
  const std::vector<std::string_view> keys = ItemKeys(items);
  const Grants grants = WriteGrants(minter_, write_deadline_ms, keys);
  AddPlacements(service_.PromoteStart(Self(caller, *req), items), write_deadline_ms, grants, resp);
  return grpc::Status::OK;
}

grpc::Status MasterGrpcService::DoPromoteEnd(const Caller& caller, const v1::PromoteEndRequest* req,
                                             v1::PromoteEndResponse* resp) {
  std::vector<PromoteItem> items;
  std::vector<bool> written;
  for (const auto& item : req->items()) {
    items.push_back({item.key(), item.generation()});
    written.push_back(item.written());
  }
  AddResults(service_.PromoteEnd(Self(caller, *req), items, written), resp);
  return grpc::Status::OK;
}

grpc::Status MasterGrpcService::DoTakeOffloadTasks(const Caller& caller,
                                                   const v1::TakeOffloadTasksRequest* req,
                                                   v1::TakeOffloadTasksResponse* resp) {
  size_t max = req->max_tasks() == 0 ? 64 : std::min<size_t>(req->max_tasks(), max_batch_items_);
  auto tasks = service_.TakeOffloadTasks(Self(caller, *req), req->session(), max);
  if (!tasks.ok()) return ToGrpcStatus(tasks.status());
  for (const OffloadTask& t : *tasks) {
    v1::OffloadTask* out = resp->add_tasks();
    out->set_kind(t.kind == OffloadTask::Kind::kOffload ? v1::OFFLOAD : v1::DROP);
    out->set_key(t.key);
    out->set_generation(t.generation);
    out->set_size(t.size);
    out->set_checksum(t.checksum);
    out->set_segment_id(t.segment_id);
    out->set_offset(t.offset);
    out->set_locator(t.locator);
  }
  return grpc::Status::OK;
}

grpc::Status MasterGrpcService::DoReportObjects(const Caller& caller,
                                                const v1::ReportObjectsRequest* req,
                                                v1::ReportObjectsResponse* resp) {
  // With authentication the caller's token names its live session: a report of another one
  // (an older registration) is refused whole, as MetadataService refuses a stale session.
  if (caller.authenticated() && req->session() != caller.session) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "the report names another session than the caller's current one");
  }
  std::vector<ReportedObjectItem> items;
  items.reserve(static_cast<size_t>(req->items_size()));
  for (const v1::ReportedObject& item : req->items()) {
    items.push_back({item.key(), item.generation(), item.size(), item.checksum(), item.segment_id(),
                     item.offset()});
  }
  auto results = service_.ReportObjects(Self(caller, *req), req->session(), items, req->last());
  if (!results.ok()) return ToGrpcStatus(results.status());
  AddResults(*results, resp);
  return grpc::Status::OK;
}

grpc::Status MasterGrpcService::DoReportReplicaFaults(const Caller& caller,
                                                      const v1::ReportReplicaFaultsRequest* req,
                                                      v1::ReportReplicaFaultsResponse* resp) {
  std::vector<ReplicaFaultItem> items;
  items.reserve(static_cast<size_t>(req->items_size()));
  std::vector<absl::Status> invalid(static_cast<size_t>(req->items_size()));
  std::vector<size_t> index;
  for (int i = 0; i < req->items_size(); ++i) {
    const v1::ReplicaFaultItem& item = req->items(i);
    if (item.fault() != v1::CORRUPT && item.fault() != v1::UNREACHABLE) {
      invalid[static_cast<size_t>(i)] =
          McError(Code::kInvalidArgument, "fault must be CORRUPT or UNREACHABLE");
      continue;
    }
    items.push_back(
        {item.fault() == v1::CORRUPT ? ReplicaFault::kCorrupt : ReplicaFault::kUnreachable,
         item.key(), item.generation(), item.holder(), item.segment_id(), item.offset()});
    index.push_back(static_cast<size_t>(i));
  }
  std::vector<absl::Status> results =
      service_.ReportReplicaFaults(Self(caller, *req), caller.session, items);
  for (size_t k = 0; k < index.size(); ++k) invalid[index[k]] = std::move(results[k]);
  AddResults(invalid, resp);
  return grpc::Status::OK;
}

grpc::Status MasterGrpcService::DoHello(const Caller&, const v1::HelloRequest*,
                                        v1::HelloResponse* resp) {
  if (auth_ != nullptr) resp->set_run_id(auth_->run_id());
  return grpc::Status::OK;
}

grpc::Status MasterGrpcService::DoGetStatus(const Caller&, const v1::GetStatusRequest*,
                                            v1::GetStatusResponse* resp) {
  MasterSnapshot snap = service_.Snapshot();
  resp->set_status_line(service_.StatusLine());
  resp->set_mem_used(snap.mem_used);
  resp->set_mem_capacity(snap.mem_capacity);
  resp->set_keys(snap.keys);
  for (const ClientInfo& c : service_.Clients()) {
    v1::ClientStatus* cs = resp->add_clients();
    SegmentStats seg = service_.ClientSegmentStats(c.client_id);
    cs->set_client_id(c.client_id);
    cs->set_host(c.host);
    cs->set_data_endpoint(c.endpoint);
    cs->set_capacity(seg.capacity);
    cs->set_used(seg.used);
    cs->set_disk_capacity(c.disk_capacity);
    cs->set_disk_used(c.disk_used);
  }
  return grpc::Status::OK;
}

}  // namespace mc::master
