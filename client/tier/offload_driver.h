// OffloadDriver: this daemon's SSD tier at work for the cluster.
//
// - Runs the master's tasks (TakeOffloadTasks, polled from its own thread): OFFLOAD copies a
//   memory replica out of our segment, checks it against the checksum in the task (the bytes
//   could have been evicted and overwritten meanwhile), writes the record and reports the DISK
//   replica (AddDiskReplicas); DROP deletes a record whose object was removed. Up to
//   `parallelism` OFFLOADs run at once and are reported in steps of `task_report_batch`, by the
//   worker that completes the step while the others keep writing; one the
//   tier cannot take (full, failing) is reported as failed, so the master stops waiting for it
//   (write-back, DESIGN.md invariant 7). While polls bring tasks, the next poll follows at once.
// - After every registration with the master, reports every record on disk (recovered=true), so
//   persisted objects survive a client or master restart.
// - Guards the tier's own eviction: a record may be reclaimed only after the master agreed to
//   drop its DISK replica, which it refuses while a reader holds a lease.
// - Serves READ_DISK requests of the data plane (remote readers, over tcp; it sees them through
//   transfer/data_server.h) and local DISK reads (DiskReader).
//   A record that fails verification answers CHECKSUM_MISMATCH (to a remote reader too: the frame
//   carries the code), and is dropped: the master is told first (RemoveDiskReplicas, corrupt),
//   so later gets fall to another replica or NOT_FOUND, then the record is deleted.
// Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "client/session/master_client.h"
#include "client/tier/disk_reader.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/periodic_thread.h"
#include "offload/disk_tier.h"
#include "transfer/data_server.h"
#include "transfer/transfer_engine.h"

namespace mc::client {

struct OffloadDriverOptions {
  std::string client_id;
  int64_t poll_interval_ms = 100;  // TakeOffloadTasks period
  uint32_t max_tasks_per_poll = 64;
  size_t report_batch = 1000;  // records per AddDiskReplicas call when re-reporting
  // After a failed RemoveDiskReplicas (master unreachable or hung), the reclaim guard refuses
  // without asking for this long: an offload write then waits for at most one RPC timeout,
  // not one per reclaim round.
  int64_t reclaim_backoff_ms = 5000;
  // OFFLOAD tasks written at once (each on its own thread, the tier pipelining its chunks).
  int parallelism = 4;
  // Records per AddDiskReplicas report while running tasks: their memory may be reused only once
  // reported, so a burst reports in small steps rather than after the whole poll's tasks.
  size_t task_report_batch = 4;
  // The clock of the poll waits and the reclaim backoff (borrowed); null = RealClock.
  const Clock* clock = nullptr;
};

class OffloadDriver final : public DiskReader {
 public:
  // `session()` gives the current master session (0 while unregistered).
  OffloadDriver(OffloadDriverOptions options, offload::DiskTier& tier, MasterClient& master,
                transfer::SegmentTable& segments, std::function<uint64_t()> session,
                MetricsRegistry& metrics);
  ~OffloadDriver() override;

  void Start();
  void Stop();
  // Called after each registration: the next loop iteration re-reports every record.
  void RequestReport() { report_pending_ = true; }

  // The DiskTier's reclaim guard.
  std::vector<bool> MayReclaim(const std::vector<offload::DiskTierVictim>& victims);
  // The data plane's handler for DataOp::kReadDisk: the record of generation
  // `request.segment_id` at locator `request.offset`, `request.length` bytes, whose key has
  // `request.key_tag`. A record we do not hold (or of another key) answers NOT_FOUND.
  absl::Status ServeReadDisk(const transfer::DataRequest& request, transfer::RequestStream& stream);
  absl::Status ReadLocal(std::string_view key, uint64_t generation, uint64_t locator,
                         uint64_t length, const std::vector<transfer::LocalBuffer>& dst,
                         uint64_t* checksum) override;

  // One iteration of the loop (tests call it directly); true when it ran tasks.
  bool RunOnce();
  // Iterations of the driver's thread completed.
  uint64_t rounds() const { return thread_.runs(); }

 private:
  void ReportAll();
  void RunTasks(const std::vector<v1::OffloadTask>& tasks);
  struct OffloadResult {
    const v1::OffloadTask* task;
    absl::Status status;
    v1::DiskReplicaItem item;  // when status is OK
  };
  // Persists OFFLOAD tasks (in parallel) and reports them, and the failed ones, to the master.
  void RunOffloads(const std::vector<const v1::OffloadTask*>& tasks);
  // One AddDiskReplicas for finished tasks: the persisted ones, and the failed ones.
  void Report(std::vector<OffloadResult>& results);
  // Persists one OFFLOAD task; fills `item` on success.
  absl::Status Offload(const v1::OffloadTask& task, v1::DiskReplicaItem* item);
  // Tells the master about records that failed verification, then deletes them.
  void DropCorrupt();
  void Remember(const std::string& key, uint64_t generation, uint64_t length);
  void Forget(uint64_t generation);

  const OffloadDriverOptions options_;
  const Clock& clock_;
  offload::DiskTier& tier_;
  MasterClient& master_;
  transfer::SegmentTable& segments_;
  const std::function<uint64_t()> session_;
  Counter& offloads_ok_;
  Counter& offloads_changed_;
  Counter& offloads_failed_;
  Counter& offloads_gone_;
  Counter& offloads_no_space_;
  Counter& drops_;
  Counter& reports_;
  Counter& disk_reads_served_;
  Counter& disk_read_failures_;
  Counter& corrupt_dropped_;
  std::atomic<bool> report_pending_{true};
  std::atomic<int64_t> reclaim_blocked_until_ms_{0};  // on clock_

  // generation -> key and payload length of every record we hold: a kReadDisk frame names only
  // the generation, and its length is checked before any memory is taken for it.
  struct KnownRecord {
    std::string key;
    uint64_t length = 0;
  };
  mutable absl::Mutex keys_mu_;
  absl::flat_hash_map<uint64_t, KnownRecord> keys_ ABSL_GUARDED_BY(keys_mu_);

  // DROP tasks that found their record busy, retried on the next poll.
  absl::Mutex retry_mu_;
  std::vector<v1::OffloadTask> retry_drops_ ABSL_GUARDED_BY(retry_mu_);
  // Records that failed verification when read, to drop on the loop's thread.
  std::vector<offload::DiskTierVictim> corrupt_ ABSL_GUARDED_BY(retry_mu_);

  PeriodicThread thread_;  // last: it runs RunOnce() on the members above
};

}  // namespace mc::client
