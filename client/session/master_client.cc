#include "client/session/master_client.h"

#include <array>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/session/master_lane_client.h"
#include "client/session/packed_keys_gate.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/master_credentials.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "common/util.h"
#include "proto/master_lane_frame.h"
#include "proto/packed_lookups.h"
#include "proto/status_convert.h"

namespace mc::client {
namespace {

class GrpcMasterClient final : public MasterClient {
 public:
  explicit GrpcMasterClient(const GrpcMasterClientOptions& options)
      : options_(options), lane_counts_(LaneCounters(options.metrics)) {
    absl::MutexLock lock(&targets_mu_);
    for (absl::string_view a : absl::StrSplit(options.address, ',', absl::SkipWhitespace())) {
      AddTargetLocked(std::string(absl::StripAsciiWhitespace(a)));
    }
    if (targets_.empty()) AddTargetLocked(options.address);
  }
  // Sends what is queued, then waits for the answers: every release has the RPC deadline.
  ~GrpcMasterClient() override {
    {
      absl::MutexLock lock(&release_mu_);
      stopping_ = true;
      sender_cv_.SignalAll();
    }
    if (release_sender_.joinable()) release_sender_.join();
    WaitForReleases();
  }

  absl::Status RegisterClient(const v1::RegisterClientRequest& req,
                              v1::RegisterClientResponse* resp) override {
    // The proof names the master run it is for (docs/security.md): asked of the master that
    // serves now. Should another one answer the registration (a failover in between), it refuses
    // the proof and the session registers again.
    std::string run_id;
    if (options_.cluster_keys) {
      v1::HelloResponse hello;
      grpc::Status h = Invoke(&v1::Master::Stub::Hello, v1::HelloRequest(), &hello, Retry::kAlways,
                              [](grpc::ClientContext*) {});
      if (!h.ok()) return FromGrpcStatus(h);
      run_id = hello.run_id();
    }
    // A fresh proof per attempt: each master remembers the nonces it saw.
    auto prepare = [&](grpc::ClientContext* ctx) {
      if (!options_.cluster_keys) return;
      ctx->AddMetadata(
          auth::kProofHeader,
          auth::MakeProof(*options_.cluster_keys, auth::ProofRole::kRegister, req.client_id(),
                          req.data_endpoint(), auth::UnixNowMs(), run_id));
      // The session being replaced, if any: proves this is the daemon that holds it.
      std::string session = SessionCredential();
      if (!session.empty()) ctx->AddMetadata(auth::kSessionHeader, session);
    };
    grpc::Status g =
        Invoke(&v1::Master::Stub::RegisterClient, req, resp, Retry::kIfNotExecuted, prepare);
    absl::Status s = FromGrpcStatus(g);
    if (s.ok() && options_.cluster_keys) {
      absl::MutexLock lock(&session_mu_);
      session_credential_ =
          resp->session_token().size() == auth::kSessionTokenSize
              ? auth::MakeSessionCredential(req.client_id(), resp->session_token())
              : std::string();
    }
    if (s.ok()) OpenLane(resp->lane_port());
    return s;
  }
  absl::Status Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp) override {
    grpc::Status s = Invoke(&v1::Master::Stub::Heartbeat, req, resp, Retry::kIfNotExecuted,
                            [this](grpc::ClientContext* ctx) { AddCredentials(ctx); });
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      resp->set_known(false);  // the master does not know our session: register again
      return absl::OkStatus();
    }
    return FromGrpcStatus(s);
  }
  absl::Status UnregisterClient(const v1::UnregisterClientRequest& req) override {
    v1::UnregisterClientResponse resp;
    return Call(&v1::Master::Stub::UnregisterClient, req, &resp);
  }
  absl::Status PutStart(const v1::PutStartRequest& req, v1::PutStartResponse* resp) override {
    WaitForReleases();
    return HotCall(lane::kPutStart, &v1::Master::Stub::PutStart, req, resp);
  }
  absl::Status PutEnd(const v1::PutEndRequest& req, v1::PutEndResponse* resp) override {
    return HotCall(lane::kPutEnd, &v1::Master::Stub::PutEnd, req, resp);
  }
  absl::Status PutRevoke(const v1::PutRevokeRequest& req, v1::PutRevokeResponse* resp) override {
    return HotCall(lane::kPutRevoke, &v1::Master::Stub::PutRevoke, req, resp);
  }
  // Carries the releases still queued; they end before the lookup (master.proto). When the call
  // fails they go back to the queue to be sent alone (a release is idempotent), so a lookup the
  // master rejects never takes releases down with it. With release_delay_us 0 nothing is
  // carried (the setting for a master too old to know `releases`). Their keys travel packed
  // (pack_release_keys) unless packing rests: a master that does not read packed release keys
  // answers releases_seen 0, and the releases are then queued again, one by one, to go alone.
  absl::Status GetReplicas(const v1::GetReplicasRequest& req,
                           v1::GetReplicasResponse* resp) override {
    std::deque<std::unique_ptr<PendingRelease>> carried;
    if (options_.release_delay_us > 0) {
      absl::MutexLock lock(&release_mu_);
      carried.swap(release_queue_);
    }
    if (carried.empty()) {
      return HotCall(lane::kGetReplicas, &v1::Master::Stub::GetReplicas, req, resp, Retry::kAlways);
    }
    const bool pack = options_.pack_release_keys && !release_packing_.Resting();
    v1::GetReplicasRequest with_releases = req;
    uint64_t release_keys = 0;
    for (auto& call : carried) {
      v1::ReleaseLeasesRequest* release = with_releases.add_releases();
      *release = std::move(call->req);
      if (pack) PackRequestKeys(release);
      release_keys += ReleaseKeyCount(*release);
    }
    absl::Status s = HotCall(lane::kGetReplicas, &v1::Master::Stub::GetReplicas, with_releases,
                             resp, Retry::kAlways);
    // A release is idempotent: kSome is sent again like kNone.
    const bool unseen =
        s.ok() && pack &&
        PackedKeysGate::Classify(resp->releases_seen(), release_keys) != PackedKeysGate::Seen::kAll;
    if (!s.ok() || unseen) {
      if (unseen) release_packing_.OlderMaster(resp->releases_seen(), release_keys, "GetReplicas");
      for (size_t i = 0; i < carried.size(); ++i) {
        carried[i]->req = std::move(*with_releases.mutable_releases(static_cast<int>(i)));
        MC_CHECK(NameRequestKeysOneByOne(&carried[i]->req).ok());  // packed here from whole keys
      }
      absl::MutexLock lock(&release_mu_);
      for (auto it = carried.rbegin(); it != carried.rend(); ++it) {
        release_queue_.push_front(std::move(*it));
      }
      send_now_ = true;
      sender_cv_.SignalAll();
      return s;
    }
    for (auto& call : carried) call->done(absl::OkStatus());
    absl::MutexLock lock(&release_mu_);
    for (auto& call : carried) outstanding_.erase(call->ticket);
    done_cv_.SignalAll();  // only a waiting PutStart/Remove/ReleaseLeases: not the sender
    return s;
  }
  // An application's explicit release (a MatchPrefix lease) also ends the leases of this client's
  // earlier gets first: once it returns, nothing this client read before is still leased.
  // Keys that came packed go packed unless packing is off or rests; a master that did not read
  // them all (keys_seen short: older) gets the release again one by one (it is idempotent).
  absl::Status ReleaseLeases(const v1::ReleaseLeasesRequest& req) override {
    WaitForReleases();
    const bool packed = req.packed_key_sizes_size() != 0 || !req.packed_keys().empty();
    v1::ReleaseLeasesResponse resp;
    if (!packed || (options_.pack_release_keys && !release_packing_.Resting())) {
      absl::Status s = HotCall(lane::kReleaseLeases, &v1::Master::Stub::ReleaseLeases, req, &resp,
                               Retry::kAlways);
      const uint64_t asked = ReleaseKeyCount(req);
      if (!s.ok() || !packed ||
          PackedKeysGate::Classify(resp.keys_seen(), asked) == PackedKeysGate::Seen::kAll) {
        return s;
      }
      release_packing_.OlderMaster(resp.keys_seen(), asked, "ReleaseLeases");
      resp.Clear();
    }
    v1::ReleaseLeasesRequest one_by_one = req;
    MC_RETURN_IF_ERROR(NameRequestKeysOneByOne(&one_by_one));
    return HotCall(lane::kReleaseLeases, &v1::Master::Stub::ReleaseLeases, one_by_one, &resp,
                   Retry::kAlways);
  }
  void ReleaseLeasesAsync(v1::ReleaseLeasesRequest req,
                          std::function<void(absl::Status)> done) override {
    auto call = std::make_unique<PendingRelease>();
    call->req = std::move(req);
    call->done = std::move(done);
    call->queued = absl::Now();
    absl::MutexLock lock(&release_mu_);
    if (!release_sender_.joinable()) release_sender_ = std::thread([this] { SendReleases(); });
    call->ticket = next_ticket_++;
    outstanding_.insert(call->ticket);
    // The sender needs waking only when it sleeps for want of work: while busy it looks at the
    // queue at least every release_delay_us on its own, so a stream of gets never pays a
    // wake-up of another thread (a futex and, on a VM, a hypervisor exit) for its release.
    release_queue_.push_back(std::move(call));
    if (sender_idle_ || options_.release_delay_us <= 0) sender_cv_.SignalAll();
  }
  absl::Status Exist(const v1::ExistRequest& req, v1::ExistResponse* resp) override {
    return HotCall(lane::kExist, &v1::Master::Stub::Exist, req, resp, Retry::kAlways);
  }
  absl::Status Remove(const v1::RemoveRequest& req, v1::RemoveResponse* resp) override {
    WaitForReleases();
    return HotCall(lane::kRemove, &v1::Master::Stub::Remove, req, resp);
  }
  absl::Status AddDiskReplicas(const v1::AddDiskReplicasRequest& req,
                               v1::AddDiskReplicasResponse* resp) override {
    return Call(&v1::Master::Stub::AddDiskReplicas, req, resp);
  }
  absl::Status RemoveDiskReplicas(const v1::RemoveDiskReplicasRequest& req,
                                  v1::RemoveDiskReplicasResponse* resp) override {
    return Call(&v1::Master::Stub::RemoveDiskReplicas, req, resp);
  }
  absl::Status TakeOffloadTasks(const v1::TakeOffloadTasksRequest& req,
                                v1::TakeOffloadTasksResponse* resp) override {
    return Call(&v1::Master::Stub::TakeOffloadTasks, req, resp);
  }
  absl::Status PromoteStart(const v1::PromoteStartRequest& req,
                            v1::PromoteStartResponse* resp) override {
    return Call(&v1::Master::Stub::PromoteStart, req, resp);
  }
  absl::Status PromoteEnd(const v1::PromoteEndRequest& req, v1::PromoteEndResponse* resp) override {
    return Call(&v1::Master::Stub::PromoteEnd, req, resp);
  }
  absl::Status ReportReplicaFaults(const v1::ReportReplicaFaultsRequest& req,
                                   v1::ReportReplicaFaultsResponse* resp) override {
    // Idempotent: a replica dropped twice is NOT_FOUND the second time.
    return Call(&v1::Master::Stub::ReportReplicaFaults, req, resp, Retry::kAlways);
  }
  absl::Status ReportObjects(const v1::ReportObjectsRequest& req,
                             v1::ReportObjectsResponse* resp) override {
    return Call(&v1::Master::Stub::ReportObjects, req, resp);
  }

 private:
  void SetDeadline(grpc::ClientContext* ctx) const {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(options_.rpc_timeout_ms));
  }
  // x-mc-session for the current session ("" before the first registration or without keys).
  std::string SessionCredential() {
    absl::MutexLock lock(&session_mu_);
    return session_credential_;
  }
  void AddCredentials(grpc::ClientContext* ctx) {
    if (!options_.cluster_keys) return;
    std::string session = SessionCredential();
    if (!session.empty()) ctx->AddMetadata(auth::kSessionHeader, session);
  }
  // UNAUTHENTICATED from the master: our session is unknown to it (it restarted or dropped us,
  // or we have not registered yet). Transient like the unknown-client answers before it:
  // kUnavailable; the next Heartbeat learns the same and the session re-registers.
  static absl::Status Converted(const grpc::Status& status) {
    if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      return McError(Code::kUnavailable, "rpc: the master refused our session (" +
                                             status.error_message() +
                                             "); retry once this client has registered again");
    }
    return FromGrpcStatus(status);
  }

  // Which failed calls are tried again (on the next master) within their deadline.
  enum class Retry {
    kIfNotExecuted,  // only when certainly not executed: a standby's refusal, no connection
    kAlways,         // idempotent calls: also after any UNAVAILABLE
  };

  template <typename Req, typename Resp>
  absl::Status Call(grpc::Status (v1::Master::Stub::*method)(grpc::ClientContext*, const Req&,
                                                             Resp*),
                    const Req& req, Resp* resp, Retry retry = Retry::kIfNotExecuted) {
    return Converted(Invoke(method, req, resp, retry,
                            [this](grpc::ClientContext* ctx) { AddCredentials(ctx); }));
  }

  // A hot call: over the lane when there is one (see the header), else (or as the lane's
  // fallback) Call().
  template <typename Req, typename Resp>
  absl::Status HotCall(uint32_t lane_method,
                       grpc::Status (v1::Master::Stub::*method)(grpc::ClientContext*, const Req&,
                                                                Resp*),
                       const Req& req, Resp* resp, Retry retry = Retry::kIfNotExecuted) {
    if (std::optional<absl::Status> answered = LaneCall(lane_method, req, resp, retry)) {
      return *std::move(answered);
    }
    return Call(method, req, resp, retry);
  }

  // The lane's part of a hot call: its answer, or nullopt when the call is to go over gRPC (no
  // lane, the lane does not serve the method, the call was not sent, a standby's refusal, or an
  // idempotent call's lost answer); `*resp` is then clear.
  std::optional<absl::Status> LaneCall(uint32_t lane_method,
                                       const google::protobuf::MessageLite& req,
                                       google::protobuf::MessageLite* resp, Retry retry) {
    std::shared_ptr<MasterLaneClient> lane = Lane();
    if (lane == nullptr || !lane->Serves(lane_method)) return std::nullopt;
    grpc::Status status;
    std::string leader;
    const LaneOutcome outcome = ToLaneOutcome(
        lane->Call(lane_method, SessionCredential(), req, resp, &status, &leader), status, leader);
    CountLane(outcome);
    switch (outcome) {
      case LaneOutcome::kLane:
        return Converted(status);
      case LaneOutcome::kStandby:
        DropLane(lane.get());  // gRPC follows the leader; the next registration brings its lane
        break;
      case LaneOutcome::kUnserved:
        // An older master: it did not run the call. gRPC serves it, from now on at once.
        if (lane->MarkNotServed(lane_method)) {
          Logger("client").warn(
              "the master's lane does not serve method {} (a master older than this daemon): "
              "those calls go over gRPC until the next registration",
              lane_method);
        }
        break;
      case LaneOutcome::kLost:
        if (retry != Retry::kAlways) {
          return McError(Code::kUnavailable,
                         "rpc: the master lane lost the answer (the call may have run)");
        }
        break;
      default:
        break;
    }
    resp->Clear();
    return std::nullopt;
  }

  // How a lane call went, the label of mc_client_master_lane_calls_total.
  enum class LaneOutcome { kLane, kBusy, kNotSent, kLost, kStandby, kUnserved, kCount };
  static LaneOutcome ToLaneOutcome(MasterLaneClient::Outcome o, const grpc::Status& status,
                                   const std::string& leader) {
    switch (o) {
      case MasterLaneClient::Outcome::kAnswered:
        if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) return LaneOutcome::kUnserved;
        return status.error_code() == grpc::StatusCode::UNAVAILABLE &&
                       (!leader.empty() || absl::StartsWith(status.error_message(), kStandbyPrefix))
                   ? LaneOutcome::kStandby
                   : LaneOutcome::kLane;
      case MasterLaneClient::Outcome::kBusy:
        return LaneOutcome::kBusy;
      case MasterLaneClient::Outcome::kNotSent:
        return LaneOutcome::kNotSent;
      case MasterLaneClient::Outcome::kLost:
        return LaneOutcome::kLost;
    }
    return LaneOutcome::kLost;
  }
  using LaneCounterArray = std::array<Counter*, static_cast<size_t>(LaneOutcome::kCount)>;
  static LaneCounterArray LaneCounters(MetricsRegistry* metrics) {
    LaneCounterArray counters{};
    if (metrics == nullptr) return counters;
    const char* names[] = {"lane", "grpc_busy",    "grpc_not_sent",
                           "lost", "grpc_standby", "grpc_unserved"};
    for (size_t i = 0; i < counters.size(); ++i) {
      counters[i] = &metrics->GetCounter(
          "mc_client_master_lane_calls_total",
          "Hot master calls by path: answered over the master lane (lane), sent over gRPC "
          "instead (grpc_*; grpc_unserved: a master whose lane does not serve the call), or sent "
          "over the lane and the answer lost (lost)",
          {{"outcome", names[i]}});
    }
    return counters;
  }
  void CountLane(LaneOutcome o) {
    if (Counter* c = lane_counts_[static_cast<size_t>(o)]) c->Inc();
  }
  std::shared_ptr<MasterLaneClient> Lane() {
    absl::MutexLock lock(&lane_mu_);
    return lane_;
  }
  void DropLane(const MasterLaneClient* which) {
    absl::MutexLock lock(&lane_mu_);
    if (lane_.get() == which) lane_.reset();
  }
  // The lane's TLS context when the master's channel uses TLS (made once from the same files;
  // null: plaintext, or TLS that could not be set up, which leaves the lane off).
  std::shared_ptr<const lane::TlsContext> LaneTls() {
    if (!options_.security.tls()) return nullptr;
    absl::MutexLock lock(&lane_mu_);
    if (lane_tls_ == nullptr && !lane_tls_failed_) {
      absl::StatusOr<std::shared_ptr<const lane::TlsContext>> tls =
          lane::TlsContext::ForClient(options_.security.files());
      if (tls.ok()) {
        lane_tls_ = std::move(*tls);
      } else {
        lane_tls_failed_ = true;
        Logger("client").warn("master lane off: {}", tls.status().ToString());
      }
    }
    return lane_tls_;
  }
  // After a registration: the lane of the master that answered it (`port` 0: none).
  void OpenLane(uint32_t port) {
    std::shared_ptr<MasterLaneClient> lane;
    if (port != 0 && options_.lane) {
      size_t index = 0;
      absl::StatusOr<HostPort> hp = ParseHostPort(Current(&index)->address);
      std::shared_ptr<const lane::TlsContext> tls = LaneTls();
      if (hp.ok() && !hp->host.empty() && (tls != nullptr || !options_.security.tls())) {
        // With TLS, the name gRPC checks: the server-name override, else the dialled host.
        const std::string& name = options_.security.files().server_name;
        lane = std::make_shared<MasterLaneClient>(MasterLaneClientOptions{
            .host = hp->host,
            .port = static_cast<int>(port),
            .timeout_ms = options_.rpc_timeout_ms,
            .max_connections = options_.lane_connections,
            .max_message_bytes = static_cast<size_t>(options_.max_message_bytes),
            .tls = std::move(tls),
            .tls_host = name.empty() ? hp->host : name});
      }
    }
    absl::MutexLock lock(&lane_mu_);
    lane_ = std::move(lane);
  }

  // One call within one deadline, following the leader: see MasterTargets.
  template <typename Req, typename Resp, typename Prepare>
  grpc::Status Invoke(grpc::Status (v1::Master::Stub::*method)(grpc::ClientContext*, const Req&,
                                                               Resp*),
                      const Req& req, Resp* resp, Retry retry, const Prepare& prepare) {
    const auto deadline =
        std::chrono::system_clock::now() + std::chrono::milliseconds(options_.rpc_timeout_ms);
    for (int attempt = 0;; ++attempt) {
      size_t index = 0;
      Target* target = Current(&index);
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline);
      prepare(&ctx);
      grpc::Status s = ((*target->stub).*method)(&ctx, req, resp);
      if (!FailOver(s, ctx, index, retry, attempt, deadline)) return s;
      resp->Clear();
    }
  }

  struct Target {
    std::string address;
    std::unique_ptr<v1::Master::Stub> stub;
  };
  void AddTargetLocked(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(targets_mu_) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(options_.max_message_bytes);
    args.SetMaxSendMessageSize(options_.max_message_bytes);
    // Reconnect quickly after a master restart.
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    auto target = std::make_unique<Target>();
    target->address = address;
    target->stub = v1::Master::NewStub(options_.security.CreateChannel(address, args));
    targets_.push_back(std::move(target));
  }
  Target* Current(size_t* index) {
    absl::MutexLock lock(&targets_mu_);
    *index = current_;
    return targets_[current_].get();
  }

  // After a failed call on target `index`: moves the current master (to the leader a standby
  // named, else the next address) when the failure says this one cannot serve, and says whether
  // to try the call again. A single address keeps today's behaviour: no retry.
  bool FailOver(const grpc::Status& s, const grpc::ClientContext& ctx, size_t index, Retry retry,
                int attempt, std::chrono::system_clock::time_point deadline) {
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
        s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return false;
    }
    std::string leader;
    const auto& trailing = ctx.GetServerTrailingMetadata();
    auto it = trailing.find(auth::kLeaderHeader);
    if (it != trailing.end()) leader.assign(it->second.data(), it->second.size());
    const bool standby = !leader.empty() || absl::StartsWith(s.error_message(), kStandbyPrefix);
    const bool not_connected = s.error_code() == grpc::StatusCode::UNAVAILABLE &&
                               (absl::StrContains(s.error_message(), "failed to connect") ||
                                absl::StrContains(s.error_message(), "onnection refused"));
    size_t count = 0;
    {
      absl::MutexLock lock(&targets_mu_);
      count = targets_.size();
      if (count == 1 && leader.empty()) return false;
      if (current_ == index) {
        size_t next = (index + 1) % count;
        if (!leader.empty() && leader != targets_[index]->address) {
          next = targets_.size();
          for (size_t i = 0; i < targets_.size(); ++i) {
            if (targets_[i]->address == leader) next = i;
          }
          // A leader not in the list (advertised under another name): added, within a bound.
          if (next == targets_.size() && targets_.size() < kMaxTargets) AddTargetLocked(leader);
          if (next >= targets_.size()) next = (index + 1) % count;
        }
        current_ = next;
        count = targets_.size();
        if (next != index) {
          MC_LOG_EVERY(std::chrono::seconds(2), Logger("client"), info,
                       "master {} cannot serve ({}): trying {}", targets_[index]->address,
                       s.error_message(), targets_[next]->address);
        }
      }
    }
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE) return false;
    if (!(standby || not_connected || retry == Retry::kAlways)) return false;
    // A whole round of refusals (an election under way): wait a little before the next.
    if (attempt + 1 >= static_cast<int>(count)) {
      const auto pause = std::chrono::milliseconds(std::min(50 * (attempt + 1), 200));
      if (std::chrono::system_clock::now() + pause >= deadline) return false;
      std::this_thread::sleep_for(pause);
    }
    return std::chrono::system_clock::now() < deadline;
  }

  static uint64_t ReleaseKeyCount(const v1::ReleaseLeasesRequest& release) {
    return static_cast<uint64_t>(release.keys_size() + release.packed_key_sizes_size());
  }

  struct PendingRelease {
    grpc::ClientContext ctx;
    v1::ReleaseLeasesRequest req;
    v1::ReleaseLeasesResponse resp;
    std::function<void(absl::Status)> done;
    uint64_t ticket = 0;  // order of queueing
    absl::Time queued;
  };

  // The release sender: starting an RPC costs ~0.1 ms of the caller's time on a small machine,
  // so gets only queue their releases. A release waits up to release_delay_us for the next
  // GetReplicas to carry it; then (or at once when a PutStart/Remove waits for it, or on
  // shutdown) this thread sends one ReleaseLeases per release: over the master lane, one after
  // another, when it serves them; otherwise over gRPC (pipelined, callback API), where the
  // completion callback reports and counts them done.
  void SendReleases() {
    const absl::Duration delay = absl::Microseconds(options_.release_delay_us);
    for (;;) {
      std::deque<std::unique_ptr<PendingRelease>> batch;
      {
        absl::MutexLock lock(&release_mu_);
        int empty_looks = 0;
        for (;;) {
          if (release_queue_.empty()) {
            if (stopping_) return;  // nothing left to send
            // Busy (releases came within the last kBusyLooks delays): look again after one
            // delay, so that queueing a release need not wake this thread; idle: sleep until
            // a release wakes it.
            if (delay <= absl::ZeroDuration() || ++empty_looks > kBusyLooks) {
              sender_idle_ = true;
              sender_cv_.Wait(&release_mu_);
              sender_idle_ = false;
              empty_looks = 0;
            } else {
              sender_cv_.WaitWithDeadline(&release_mu_, absl::Now() + delay);
            }
            continue;
          }
          empty_looks = 0;
          if (stopping_ || send_now_) break;
          const absl::Time due = release_queue_.front()->queued + delay;
          if (absl::Now() >= due) break;
          sender_cv_.WaitWithDeadline(&release_mu_, due);
        }
        send_now_ = false;  // whoever asked waits for tickets now in `batch` or in flight
        batch.swap(release_queue_);
      }
      for (auto& owned : batch) {
        // Over the lane when it serves releases: this thread waits for the answer there, and
        // gRPC's threads are not woken for it.
        if (std::optional<absl::Status> answered =
                LaneCall(lane::kReleaseLeases, owned->req, &owned->resp, Retry::kAlways)) {
          owned->done(*std::move(answered));
          const uint64_t ticket = owned->ticket;
          owned.reset();
          Completed(ticket);
          continue;
        }
        PendingRelease* call = owned.release();
        SetDeadline(&call->ctx);
        AddCredentials(&call->ctx);
        size_t index = 0;
        Current(&index)->stub->async()->ReleaseLeases(&call->ctx, &call->req, &call->resp,
                                                      [this, call](grpc::Status status) {
                                                        call->done(Converted(status));
                                                        const uint64_t ticket = call->ticket;
                                                        delete call;
                                                        Completed(ticket);
                                                      });
      }
    }
  }

  // A release sent alone was answered (or failed), reported and freed: counts it done, which
  // wakes whoever waits for it (a PutStart/Remove/ReleaseLeases in WaitForReleases, or the
  // destructor). Last: once it returns the client may be gone.
  void Completed(uint64_t ticket) ABSL_LOCKS_EXCLUDED(release_mu_) {
    absl::MutexLock lock(&release_mu_);
    outstanding_.erase(ticket);
    done_cv_.SignalAll();
  }

  // Waits until every release queued before this call has been answered (or failed); releases
  // queued later do not hold it up, so a steady stream of gets cannot starve a put.
  void WaitForReleases() {
    absl::MutexLock lock(&release_mu_);
    const uint64_t mine = next_ticket_;
    if (!release_queue_.empty()) {
      send_now_ = true;  // no holding back what this call waits for
      sender_cv_.SignalAll();
    }
    while (!outstanding_.empty() && *outstanding_.begin() < mine) done_cv_.Wait(&release_mu_);
  }

  static constexpr char kStandbyPrefix[] = "mc-master standby";
  static constexpr size_t kMaxTargets = 32;
  // Empty looks (one per release delay) before the release sender sleeps until woken.
  static constexpr int kBusyLooks = 16;

  const GrpcMasterClientOptions options_;
  const LaneCounterArray lane_counts_;
  absl::Mutex lane_mu_;
  // The lane of the master that answered the last registration; null: none. Shared: calls in
  // flight keep theirs while a registration replaces it.
  std::shared_ptr<MasterLaneClient> lane_ ABSL_GUARDED_BY(lane_mu_);
  std::shared_ptr<const lane::TlsContext> lane_tls_ ABSL_GUARDED_BY(lane_mu_);
  bool lane_tls_failed_ ABSL_GUARDED_BY(lane_mu_) = false;
  // One channel per master address (never removed: Target pointers stay valid) and the one
  // calls go to now.
  absl::Mutex targets_mu_;
  std::vector<std::unique_ptr<Target>> targets_ ABSL_GUARDED_BY(targets_mu_);
  size_t current_ ABSL_GUARDED_BY(targets_mu_) = 0;
  absl::Mutex session_mu_;
  std::string session_credential_ ABSL_GUARDED_BY(session_mu_);
  // Whether release keys go packed (carried ones, and a ReleaseLeases that came packed; rests
  // after a master that does not read them).
  PackedKeysGate release_packing_{RealClock::Get(), options_.packed_release_retry_ms,
                                  "lease releases"};
  absl::Mutex release_mu_;
  absl::CondVar sender_cv_;  // wakes the release sender
  absl::CondVar done_cv_;    // releases answered: wakes WaitForReleases
  uint64_t next_ticket_ ABSL_GUARDED_BY(release_mu_) = 0;
  std::set<uint64_t> outstanding_ ABSL_GUARDED_BY(release_mu_);  // queued or sent, not answered
  std::deque<std::unique_ptr<PendingRelease>> release_queue_ ABSL_GUARDED_BY(release_mu_);
  bool stopping_ ABSL_GUARDED_BY(release_mu_) = false;
  bool send_now_ ABSL_GUARDED_BY(release_mu_) = false;     // the sender skips the delay once
  bool sender_idle_ ABSL_GUARDED_BY(release_mu_) = false;  // waits without a deadline
  std::thread release_sender_;
};

}  // namespace

std::unique_ptr<MasterClient> CreateGrpcMasterClient(const GrpcMasterClientOptions& options) {
  return std::make_unique<GrpcMasterClient>(options);
}

}  // namespace mc::client
