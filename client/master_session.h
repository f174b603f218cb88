// MasterSession: this daemon's membership in the cluster.
//
// Registers with the master (id, host, data endpoint, segments), publishes the segments under
// the ids the master assigned, and heartbeats from its own thread. When a heartbeat is answered
// "unknown" (the master restarted or expired us) or registration failed, it registers again and
// republishes the segments under their new ids; `on_registered` runs after every successful
// registration (the SSD tier re-reports its records there). Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "client/master_client.h"
#include "client/segment_pool.h"
#include "transfer/transfer_engine.h"

namespace mc::client {

struct MasterSessionOptions {
  std::string client_id;
  std::string host;
  std::string data_endpoint;
  uint64_t disk_capacity = 0;
  int64_t retry_interval_ms = 500;  // between failed registrations
};

class MasterSession {
 public:
  MasterSession(MasterSessionOptions options, MasterClient& master, SegmentPool& pool,
                transfer::SegmentTable& table);
  ~MasterSession();

  // Registers once (so the daemon can report a clear error at start); then starts heartbeats.
  absl::Status Start();
  // Stops heartbeating and tells the master we leave.
  void Stop();

  void SetOnRegistered(std::function<void()> fn) { on_registered_ = std::move(fn); }
  // What each registration and known-session heartbeat answer carries for the data plane's
  // capability checks (docs/security.md): the sealed owner key (registration only; null
  // for a heartbeat), the master's clock, and our RealClock ms when the call was sent. Runs on
  // the caller of Start() and then on the session thread, before on_registered. Before Start().
  struct CapabilityInfo {
    const std::string* sealed_key = nullptr;
    uint64_t master_clock_ms = 0;
    int64_t sent_ms = 0;
  };
  void SetOnCapabilityInfo(std::function<void(const CapabilityInfo&)> fn) {
    on_capability_info_ = std::move(fn);
  }
  void SetDiskUsedFn(std::function<uint64_t()> fn) { disk_used_ = std::move(fn); }
  const std::string& client_id() const { return options_.client_id; }
  bool registered() const { return registered_.load(); }
  // The current session, 0 while unregistered.
  uint64_t session() const { return registered_.load() ? session_.load() : 0; }
  uint64_t registrations() const { return registrations_.load(); }

 private:
  absl::Status Register();
  void Loop();

  const MasterSessionOptions options_;
  MasterClient& master_;
  SegmentPool& pool_;
  transfer::SegmentTable& table_;
  std::function<void()> on_registered_;
  std::function<void(const CapabilityInfo&)> on_capability_info_;
  std::function<uint64_t()> disk_used_;
  std::atomic<bool> registered_{false};
  std::atomic<uint64_t> registrations_{0};
  std::atomic<uint64_t> session_{0};
  std::atomic<int64_t> heartbeat_ms_{1000};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
};

}  // namespace mc::client
