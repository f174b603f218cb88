// Shared helpers for the master unit tests: a MetadataService on a FakeClock with its own
// metrics registry, and short-hands for registering clients and completing puts.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/metrics.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "master/metadata_service.h"
#include "tests/fakes/fake_clock.h"

namespace mc::master::testing {

inline Code CodeOf(const absl::Status& s) { return ToCode(s); }

// Everything observable about the master's state through its public API, for
// "bad input changes nothing" checks.
struct StateFingerprint {
  uint64_t mem_used = 0;
  uint64_t mem_capacity = 0;
  uint64_t keys = 0;
  uint64_t clients = 0;
  size_t leases = 0;
  std::vector<uint64_t> client_used;
  bool operator==(const StateFingerprint&) const = default;
};

class MasterFixture {
 public:
  explicit MasterFixture(MasterOptions options = DefaultOptions())
      : service_(std::make_unique<MetadataService>(options, clock_, metrics_)) {}

  static MasterOptions DefaultOptions() {
    MasterOptions o;
    o.lease_ttl_ms = 5000;
    o.client_ttl_ms = 10'000;
    o.put_timeout_ms = 60'000;
    o.shards = 8;
    o.alignment = 64;
    return o;
  }

  MetadataService& svc() { return *service_; }
  FakeClock& clock() { return clock_; }
  MetricsRegistry& metrics() { return metrics_; }
  uint64_t CounterValue(const std::string& name, const Labels& labels = {}) {
    return metrics_.GetCounter(name, "", labels).Value();
  }

  // Registers `id` with the given segments; returns its session.
  uint64_t Register(const std::string& id, const std::vector<uint64_t>& segments,
                    uint64_t disk_capacity = 0) {
    ClientInfo info;
    info.disk_capacity = disk_capacity;
    info.client_id = id;
    info.host = "host-" + id;
    // One endpoint per id (kept when it registers again), distinct across ids.
    auto port = ports_.emplace(id, 1000 + ports_.size()).first->second;
    info.endpoint = "10.0.0.1:" + std::to_string(port);
    auto reg = service_->RegisterClient(info, segments);
    EXPECT_TRUE(reg.ok()) << reg.status();
    sessions_[id] = reg.ok() ? reg->session : 0;
    return reg.ok() ? reg->session : 0;
  }
  void HeartbeatAll() {
    for (const auto& [id, session] : sessions_) service_->Heartbeat(id, session, 0);
  }

  PutStartOutcome Start(const std::string& client, std::string_view key, uint64_t size,
                        uint32_t replicas = 1) {
    auto out = service_->PutStart(client, {{key, size}}, replicas);
    return std::move(out[0]);
  }
  absl::Status End(const std::string& client, std::string_view key, uint64_t generation,
                   uint64_t checksum = 42) {
    return service_->PutEnd(client, {{key, generation, checksum}})[0];
  }
  // PutStart + PutEnd; returns the generation (0 on failure, with a test failure recorded).
  uint64_t Put(const std::string& client, std::string_view key, uint64_t size,
               uint32_t replicas = 1) {
    PutStartOutcome o = Start(client, key, size, replicas);
    EXPECT_TRUE(o.status.ok()) << key << ": " << o.status;
    if (!o.status.ok()) return 0;
    absl::Status s = End(client, key, o.generation);
    EXPECT_TRUE(s.ok()) << key << ": " << s;
    return o.generation;
  }
  Code Lookup(std::string_view key, bool lease = false) {
    LookupOptions opts;
    opts.grant_lease = lease;
    return CodeOf(service_->GetReplicas({key}, opts).results[0].status);
  }
  bool Exists(std::string_view key) { return service_->Exist({key})[0]; }

  StateFingerprint Fingerprint() {
    StateFingerprint f;
    MasterSnapshot s = service_->Snapshot();
    f.mem_used = s.mem_used;
    f.mem_capacity = s.mem_capacity;
    f.keys = service_->KeyCount();
    f.clients = s.clients;
    f.leases = service_->ActiveLeaseCount();
    for (const auto& [id, session] : sessions_) f.client_used.push_back(service_->ClientSegmentStats(id).used);
    return f;
  }

 private:
  FakeClock clock_;
  MetricsRegistry metrics_;
  std::unique_ptr<MetadataService> service_;
  std::map<std::string, uint64_t> sessions_;
  std::map<std::string, size_t> ports_;
};

}  // namespace mc::master::testing
