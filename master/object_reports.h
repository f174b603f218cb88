// ObjectReports: restart and return. A client that registers with will_report_objects has its
// segments held (no new placement) until it reports the COMPLETE memory replicas they hold
// (ReportObjects, last=true) or object_report_timeout_ms passes (RunMaintenance:
// ReleaseTimedOutReports); the master rebuilds those objects from the report, or joins the
// replicas to known objects of the same generation, size and checksum. Reports are not
// first-come: a report that conflicts with an object only reported drops it and marks the key
// disputed (DisputedKeys). ClientLifecycle opens a report at registration (BeginReport) and
// forgets it when the client goes (DropReport). Thread-safe; report_mu_ is a leaf lock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "master/disputed_keys.h"
#include "master/master_tables.h"
#include "master/put_coordinator.h"

namespace mc::master {

class ObjectReports {
 public:
  ObjectReports(MasterTables& tables, PutCoordinator& puts, DisputedKeys& disputed);

  // An owner reports the COMPLETE memory replicas its segments hold (see master.proto
  // ReportObjects). FAILED_PRECONDITION when `session` is not the client's current one.
  // Otherwise one status per item, in order: OK when the object was restored or the replica
  // joined a known object of the same generation, size and checksum; NOT_FOUND when superseded
  // (another generation, a put in progress, removed, or a replica already on this client);
  // INVALID_ARGUMENT for a bad key, size or generation, a segment not of this registration, or
  // a range unaligned, outside it or overlapping another. `last` ends the report: the client's
  // segments take new placements again.
  // Conflicts: a report that differs in generation, size or checksum from an object that itself
  // was only reported (no put of this run vouches for it) drops that object with all its
  // replicas, and the key is remembered as disputed: every later report of it is refused
  // (CHECKSUM_MISMATCH) until a put of this run ends, since the master cannot tell which owner
  // holds the written bytes. A miss, never wrong bytes. At most kMaxDisputedKeys are
  // remembered; beyond that, reports of keys the master does not know are refused too (fail
  // closed).
  absl::StatusOr<std::vector<absl::Status>> ReportObjects(
      const std::string& client_id, uint64_t session, const std::vector<ReportedObjectItem>& items,
      bool last);

  // A registration with will_report_objects: its report starts now.
  void BeginReport(const std::string& client_id, uint64_t session);
  // The client is gone (unregistered, expired, replaced): its report, if any, ends unfinished.
  void DropReport(const std::string& client_id);
  // Maintenance: releases the held segments of clients whose report outlived
  // object_report_timeout_ms.
  void ReleaseTimedOutReports();

 private:
  // A report in progress (registration with will_report_objects, until last=true or timeout).
  struct ReportState {
    uint64_t session = 0;
    int64_t start_ms = 0;
    uint64_t reported = 0;
    uint64_t restored = 0;
    uint64_t joined = 0;
    uint64_t refused = 0;
  };
  // The ranges of a report's valid items, reserved in the client's segments.
  struct ReservedRanges {
    static constexpr size_t kNone = SIZE_MAX;
    std::vector<MemoryLocation> ranges;
    std::vector<size_t> range_of;  // items[i]'s range in `ranges`, or kNone
    uint64_t max_generation = 0;
  };
  // Pass 1, in request order: checks each item and reserves exactly its range.
  ReservedRanges ReserveReported(const std::string& client_id,
                                 const std::vector<ReportedObjectItem>& items,
                                 std::vector<absl::Status>* out);
  // Pass 2, shard by shard: restores or joins; a refused item's range goes back.
  void ApplyAll(const std::string& client_id, const std::vector<ReportedObjectItem>& items,
                const ReservedRanges& reserved, std::vector<absl::Status>* out, uint64_t* restored,
                uint64_t* joined);
  // Accounts a chunk of the report, and ends the report at its last chunk.
  void EndChunk(const std::string& client_id, uint64_t session, size_t items, uint64_t restored,
                uint64_t joined, uint64_t refused, bool last);
  // Checks one reported item's key, size and generation.
  absl::Status ValidateReported(const ReportedObjectItem& item) const;
  // Restores or joins one reported object whose range is reserved (`location`), with its shard
  // locked; a non-OK answer leaves the range to be freed by the caller.
  // A conflicting report drops the known (reported) object: its memory ranges go to `to_free`.
  absl::Status ApplyReported(ObjectTable::Shard& shard, const std::string& client_id,
                             const ReportedObjectItem& item, const MemoryLocation& location,
                             bool* restored, std::vector<MemoryLocation>* to_free)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);

  const MasterOptions& options_;
  const Clock& clock_;
  ObjectTable& table_;
  SegmentManager& segments_;
  ClientRegistry& clients_;
  OffloadQueue& offload_queue_;
  absl::Mutex& membership_mu_;
  PutCoordinator& puts_;
  DisputedKeys& disputed_;
  // Reports in progress, by client id. A leaf lock: nothing else is taken while it is held.
  absl::Mutex report_mu_;
  absl::flat_hash_map<std::string, ReportState> reports_ ABSL_GUARDED_BY(report_mu_);
  Counter& reported_restored_;
  Counter& reported_joined_;
  Counter& reported_refused_;
  Counter& reported_conflicts_;
  Counter& reports_timed_out_;
};

}  // namespace mc::master
