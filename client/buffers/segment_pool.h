// SegmentPool: the memory this daemon contributes to the cluster, mapped once at start.
//
// Each segment is an anonymous private mapping (MAP_HUGETLB first when huge pages are asked for,
// falling back to normal pages with a warning), pre-faulted by flag. The master assigns segment
// ids at registration; Publish() exposes the segments under those ids through the transfer
// engine's SegmentTable, replacing any previous ids (after a re-registration the master has
// forgotten the old ones). LocalIndexOf() maps a published id back to its position in
// segments(); an id of an earlier registration (or master run) maps to nothing. Thread-safe
// after Create.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "transfer/transfer_engine.h"

namespace mc::client {

struct SegmentPoolOptions {
  uint64_t segment_size = 0;  // bytes per segment; 0 = no segments (a pure client)
  int segment_count = 1;
  bool huge_pages = false;  // try MAP_HUGETLB first
  bool prefault = false;    // touch every page at start (MAP_POPULATE)
};

class SegmentPool {
 public:
  static absl::StatusOr<std::unique_ptr<SegmentPool>> Create(const SegmentPoolOptions& options);
  ~SegmentPool();

  struct Segment {
    char* base;
    uint64_t size;
  };
  const std::vector<Segment>& segments() const { return segments_; }
  // Registers the segments under the master's ids (same order as segments()).
  void Publish(const std::vector<uint64_t>& ids, transfer::SegmentTable& table);
  // The position in segments() of the segment published under `segment_id` now, if any.
  std::optional<size_t> LocalIndexOf(uint64_t segment_id) const;
  // The ids published now, by position (shorter than segments() if the master named fewer).
  std::vector<uint64_t> published_ids() const;

 private:
  SegmentPool() = default;
  std::vector<Segment> segments_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> published_ids_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mc::client
