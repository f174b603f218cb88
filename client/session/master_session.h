// MasterSession: this daemon's membership in the cluster.
//
// Registers with the master (id, host, data endpoint, segments), publishes the segments under
// the ids the master assigned, and heartbeats from its own thread. When a heartbeat is answered
// "unknown" (the master restarted or expired us) or registration failed, it registers again and
// republishes the segments under their new ids; `on_registered` runs after every successful
// registration (the SSD tier re-reports its records there).
//
// With an ObjectIndex (SetObjectIndex; mc-client --object_index) the registration asks the
// master to hold our segments out of placement (will_report_objects) and, once the segments are
// published under the new ids, the session verifies every index entry's bytes against its
// checksum (a mismatch is dropped and counted), names it by the new segment id and reports the
// index in ReportObjects chunks (report_chunk_items / report_chunk_bytes, the last one marked
// last, empty if need be); entries the master does not answer OK are dropped. A failed report
// fails the registration (the loop registers and reports again), except UNIMPLEMENTED (an
// mc-master older than the report: a warning, and the session serves on). Heartbeat answers name
// the replicas the master freed in our segments (forgotten): they leave the index; with
// more_forgotten the session heartbeats again at once (at most max_forget_rounds times).
// Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "client/buffers/segment_pool.h"
#include "client/session/master_client.h"
#include "client/session/object_index.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/periodic_thread.h"
#include "transfer/transfer_engine.h"

namespace mc::client {

struct MasterSessionOptions {
  std::string client_id;
  std::string host;
  std::string data_endpoint;
  uint64_t disk_capacity = 0;
  int64_t retry_interval_ms = 500;  // between failed registrations
  // Object report chunks: at most this many items and about this many bytes each.
  size_t report_chunk_items = 4096;
  size_t report_chunk_bytes = 4 << 20;
  // Heartbeats in a row while the master answers more_forgotten.
  int max_forget_rounds = 16;
  MetricsRegistry* metrics = nullptr;  // optional: the index report and forget counters
  // The clock of the heartbeat and registration waits (borrowed); null = RealClock.
  const Clock* clock = nullptr;
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
  // The owner-side index to report after every registration (borrowed; null = none, the
  // default: no report). Before Start().
  void SetObjectIndex(ObjectIndex* index) { index_ = index; }
  // What the last object report did.
  struct ReportStats {
    size_t reported = 0;       // items sent
    size_t kept = 0;           // answered OK
    size_t dropped = 0;        // answered otherwise: left the index
    size_t verify_failed = 0;  // bytes no longer matched the checksum: left the index
    size_t chunks = 0;
    int64_t elapsed_ms = 0;
  };
  ReportStats last_report() const {
    absl::MutexLock lock(&stats_mu_);
    return last_report_;
  }
  // One heartbeat round now (with its more_forgotten follow-ups), outside the session thread.
  void HeartbeatForTest() { Heartbeat(); }
  // Index entries dropped because the master named them forgotten.
  uint64_t forgotten() const { return forgotten_count_.load(); }
  const std::string& client_id() const { return options_.client_id; }
  bool registered() const { return registered_.load(); }
  // The current session, 0 while unregistered.
  uint64_t session() const { return registered_.load() ? session_.load() : 0; }
  uint64_t registrations() const { return registrations_.load(); }
  // Rounds of the session thread completed (a heartbeat or a registration attempt each).
  uint64_t rounds() const { return thread_.runs(); }

 private:
  absl::Status Register();
  // One round of the session thread; returns the ms until the next.
  int64_t Round();
  // Heartbeats (again at once while more_forgotten, bounded); clears registered_ when unknown.
  void Heartbeat();
  void ApplyForgotten(const v1::HeartbeatResponse& resp);
  // Verifies and reports the index for registration `session`.
  absl::Status ReportObjects(uint64_t session);
  // Sends one chunk; erases the entries not answered OK.
  absl::Status SendReportChunk(v1::ReportObjectsRequest& req,
                               const std::vector<const ObjectIndex::Entry*>& entries,
                               ReportStats& stats);

  const MasterSessionOptions options_;
  MasterClient& master_;
  SegmentPool& pool_;
  transfer::SegmentTable& table_;
  std::function<void()> on_registered_;
  std::function<void(const CapabilityInfo&)> on_capability_info_;
  std::function<uint64_t()> disk_used_;
  ObjectIndex* index_ = nullptr;
  std::unique_ptr<MetricsRegistry> own_metrics_;  // when options_.metrics is null
  Counter* report_kept_;
  Counter* report_dropped_;
  Counter* report_verify_failed_;
  Counter* reports_failed_;
  Counter* forgotten_counter_;
  Gauge* report_ms_;
  std::atomic<uint64_t> forgotten_count_{0};
  mutable absl::Mutex stats_mu_;
  ReportStats last_report_ ABSL_GUARDED_BY(stats_mu_);
  std::atomic<bool> registered_{false};
  std::atomic<uint64_t> registrations_{0};
  std::atomic<uint64_t> session_{0};
  std::atomic<int64_t> heartbeat_ms_{1000};
  std::atomic<bool> stopped_{false};
  PeriodicThread thread_;  // last: it runs Round() on the members above
};

}  // namespace mc::client
