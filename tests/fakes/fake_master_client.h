// FakeMasterClient: a MasterClient (client/session/master_client.h) that runs the real master
// in-process.
//
// It owns a master::MetadataService on an injected FakeClock and a MasterGrpcService, and
// forwards every call to the gRPC handler (which ignores its ServerContext), converting the
// grpc::Status with proto/status_convert.h: so client components are tested against the real
// metadata logic and the real proto mapping, without sockets. Tests can make the next N calls of
// an RPC fail (UNAVAILABLE by default) and hook code after GetReplicas (e.g. advance the clock
// past the lease). Thread-safe (the service is; the knobs are atomics or set before use).
// Link: mc_fake_master (tests/fakes/CMakeLists.txt).
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "client/session/master_client.h"
#include "common/metrics.h"
#include "common/status.h"
#include "master/grpc_service.h"
#include "master/metadata_service.h"
#include "proto/status_convert.h"
#include "tests/fakes/fake_clock.h"

namespace mc::client {

class FakeMasterClient final : public MasterClient {
 public:
  // clang-format off
  enum class Rpc {
    kRegisterClient, kHeartbeat, kUnregisterClient, kPutStart, kPutEnd, kPutRevoke,
    kGetReplicas, kReleaseLeases, kExist, kRemove, kAddDiskReplicas, kRemoveDiskReplicas,
    kTakeOffloadTasks, kPromoteStart, kPromoteEnd, kReportObjects, kReportReplicaFaults, kCount
  };
  // clang-format on

  static master::MasterOptions DefaultOptions() {
    master::MasterOptions o;
    o.lease_ttl_ms = 5000;
    o.client_ttl_ms = 10'000;
    o.put_timeout_ms = 60'000;
    o.shards = 4;
    o.alignment = 64;
    return o;
  }

  // `clock` is borrowed (shared with the client components under test).
  explicit FakeMasterClient(FakeClock& clock, master::MasterOptions options = DefaultOptions())
      : clock_(clock),
        service_(std::make_unique<master::MetadataService>(options, clock_, metrics_)),
        grpc_(std::make_unique<master::MasterGrpcService>(*service_, metrics_, 100'000)) {}

  master::MetadataService& service() { return *service_; }
  MetricsRegistry& metrics() { return metrics_; }
  FakeClock& clock() { return clock_; }

  // The next `n` calls of `rpc` fail with `status` without reaching the master.
  void FailNext(Rpc rpc, int n,
                absl::Status status = McError(Code::kUnavailable, "injected: master unreachable")) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_count_[Index(rpc)] = n;
    fail_status_[Index(rpc)] = std::move(status);
  }
  void FailNextGetReplicas(int n) { FailNext(Rpc::kGetReplicas, n); }
  // Runs after every successful GetReplicas, with its response (may modify it).
  void SetAfterGetReplicas(std::function<void(v1::GetReplicasResponse*)> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    after_get_replicas_ = std::move(fn);
  }
  // Plays a master older than packed keys and packed answers: GetReplicas drops the request's
  // packed_keys, packed_key_sizes and packed fields before the master sees it.
  void SetIgnorePackedFields(bool ignore) { ignore_packed_ = ignore; }
  // Sees each ReleaseLeases request before the master does.
  void SetBeforeReleaseLeases(std::function<void(const v1::ReleaseLeasesRequest&)> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    before_release_leases_ = std::move(fn);
  }
  // ReportObjects goes to the in-process master like every call; a handler replaces that (and
  // may record what was reported).
  void SetReportObjectsHandler(
      std::function<absl::Status(const v1::ReportObjectsRequest&, v1::ReportObjectsResponse*)> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    report_objects_ = std::move(fn);
  }
  // Runs after every successful Heartbeat, with its response (may modify it: e.g. add
  // forgotten replicas).
  void SetAfterHeartbeat(std::function<void(v1::HeartbeatResponse*)> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    after_heartbeat_ = std::move(fn);
  }
  // How many times `rpc` was called (failed injections included).
  int Calls(Rpc rpc) const { return calls_[Index(rpc)].load(); }

  absl::Status RegisterClient(const v1::RegisterClientRequest& req,
                              v1::RegisterClientResponse* resp) override {
    return Forward(Rpc::kRegisterClient,
                   [&] { return grpc_->DoRegisterClient(master::Caller{}, &req, resp); });
  }
  absl::Status Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp) override {
    absl::Status s =
        Forward(Rpc::kHeartbeat, [&] { return grpc_->DoHeartbeat(master::Caller{}, &req, resp); });
    std::function<void(v1::HeartbeatResponse*)> after;
    {
      std::lock_guard<std::mutex> lock(mu_);
      after = after_heartbeat_;
    }
    if (s.ok() && after) after(resp);
    return s;
  }
  absl::Status UnregisterClient(const v1::UnregisterClientRequest& req) override {
    v1::UnregisterClientResponse resp;
    return Forward(Rpc::kUnregisterClient,
                   [&] { return grpc_->DoUnregisterClient(master::Caller{}, &req, &resp); });
  }
  absl::Status PutStart(const v1::PutStartRequest& req, v1::PutStartResponse* resp) override {
    return Forward(Rpc::kPutStart, [&] { return grpc_->DoPutStart(master::Caller{}, &req, resp); });
  }
  absl::Status PutEnd(const v1::PutEndRequest& req, v1::PutEndResponse* resp) override {
    return Forward(Rpc::kPutEnd, [&] { return grpc_->DoPutEnd(master::Caller{}, &req, resp); });
  }
  absl::Status PutRevoke(const v1::PutRevokeRequest& req, v1::PutRevokeResponse* resp) override {
    return Forward(Rpc::kPutRevoke,
                   [&] { return grpc_->DoPutRevoke(master::Caller{}, &req, resp); });
  }
  absl::Status GetReplicas(const v1::GetReplicasRequest& req,
                           v1::GetReplicasResponse* resp) override {
    const v1::GetReplicasRequest* sent = &req;
    v1::GetReplicasRequest stripped;
    if (ignore_packed_) {
      stripped = req;
      stripped.clear_packed_keys();
      stripped.clear_packed_key_sizes();
      stripped.clear_packed();
      sent = &stripped;
    }
    absl::Status s = Forward(Rpc::kGetReplicas,
                             [&] { return grpc_->DoGetReplicas(master::Caller{}, sent, resp); });
    std::function<void(v1::GetReplicasResponse*)> hook;
    {
      std::lock_guard<std::mutex> lock(mu_);
      hook = after_get_replicas_;
    }
    if (s.ok() && hook) hook(resp);
    return s;
  }
  absl::Status ReleaseLeases(const v1::ReleaseLeasesRequest& req) override {
    std::function<void(const v1::ReleaseLeasesRequest&)> hook;
    {
      std::lock_guard<std::mutex> lock(mu_);
      hook = before_release_leases_;
    }
    if (hook) hook(req);
    v1::ReleaseLeasesResponse resp;
    return Forward(Rpc::kReleaseLeases,
                   [&] { return grpc_->DoReleaseLeases(master::Caller{}, &req, &resp); });
  }
  absl::Status Exist(const v1::ExistRequest& req, v1::ExistResponse* resp) override {
    return Forward(Rpc::kExist, [&] { return grpc_->DoExist(master::Caller{}, &req, resp); });
  }
  absl::Status Remove(const v1::RemoveRequest& req, v1::RemoveResponse* resp) override {
    return Forward(Rpc::kRemove, [&] { return grpc_->DoRemove(master::Caller{}, &req, resp); });
  }
  absl::Status AddDiskReplicas(const v1::AddDiskReplicasRequest& req,
                               v1::AddDiskReplicasResponse* resp) override {
    return Forward(Rpc::kAddDiskReplicas,
                   [&] { return grpc_->DoAddDiskReplicas(master::Caller{}, &req, resp); });
  }
  absl::Status RemoveDiskReplicas(const v1::RemoveDiskReplicasRequest& req,
                                  v1::RemoveDiskReplicasResponse* resp) override {
    return Forward(Rpc::kRemoveDiskReplicas,
                   [&] { return grpc_->DoRemoveDiskReplicas(master::Caller{}, &req, resp); });
  }
  absl::Status TakeOffloadTasks(const v1::TakeOffloadTasksRequest& req,
                                v1::TakeOffloadTasksResponse* resp) override {
    return Forward(Rpc::kTakeOffloadTasks,
                   [&] { return grpc_->DoTakeOffloadTasks(master::Caller{}, &req, resp); });
  }
  absl::Status PromoteStart(const v1::PromoteStartRequest& req,
                            v1::PromoteStartResponse* resp) override {
    return Forward(Rpc::kPromoteStart,
                   [&] { return grpc_->DoPromoteStart(master::Caller{}, &req, resp); });
  }
  absl::Status ReportReplicaFaults(const v1::ReportReplicaFaultsRequest& req,
                                   v1::ReportReplicaFaultsResponse* resp) override {
    return Forward(Rpc::kReportReplicaFaults,
                   [&] { return grpc_->DoReportReplicaFaults(master::Caller{}, &req, resp); });
  }
  absl::Status PromoteEnd(const v1::PromoteEndRequest& req, v1::PromoteEndResponse* resp) override {
    return Forward(Rpc::kPromoteEnd,
                   [&] { return grpc_->DoPromoteEnd(master::Caller{}, &req, resp); });
  }
  absl::Status ReportObjects(const v1::ReportObjectsRequest& req,
                             v1::ReportObjectsResponse* resp) override {
    calls_[Index(Rpc::kReportObjects)].fetch_add(1);
    std::function<absl::Status(const v1::ReportObjectsRequest&, v1::ReportObjectsResponse*)> fn;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (fail_count_[Index(Rpc::kReportObjects)] > 0) {
        --fail_count_[Index(Rpc::kReportObjects)];
        return fail_status_[Index(Rpc::kReportObjects)];
      }
      fn = report_objects_;
    }
    if (fn) return fn(req, resp);
    return FromGrpcStatus(grpc_->DoReportObjects(master::Caller{}, &req, resp));
  }

 private:
  static size_t Index(Rpc rpc) { return static_cast<size_t>(rpc); }

  template <typename Fn>
  absl::Status Forward(Rpc rpc, Fn&& call) {
    calls_[Index(rpc)].fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (fail_count_[Index(rpc)] > 0) {
        --fail_count_[Index(rpc)];
        return fail_status_[Index(rpc)];
      }
    }
    return FromGrpcStatus(call());
  }

  FakeClock& clock_;
  MetricsRegistry metrics_;
  std::unique_ptr<master::MetadataService> service_;
  std::unique_ptr<master::MasterGrpcService> grpc_;
  std::array<std::atomic<int>, static_cast<size_t>(Rpc::kCount)> calls_{};
  std::mutex mu_;
  std::array<int, static_cast<size_t>(Rpc::kCount)> fail_count_{};
  std::array<absl::Status, static_cast<size_t>(Rpc::kCount)> fail_status_{};
  std::atomic<bool> ignore_packed_{false};
  std::function<void(v1::GetReplicasResponse*)> after_get_replicas_;
  std::function<void(v1::HeartbeatResponse*)> after_heartbeat_;
  std::function<void(const v1::ReleaseLeasesRequest&)> before_release_leases_;
  std::function<absl::Status(const v1::ReportObjectsRequest&, v1::ReportObjectsResponse*)>
      report_objects_;
};

}  // namespace mc::client
