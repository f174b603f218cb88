// SegmentPool: the memory this daemon contributes to the cluster, mapped once at start.
//
// Each segment is an anonymous private mapping (MAP_HUGETLB first when huge pages are asked for,
// falling back to normal pages with a warning), pre-faulted by flag. The master assigns segment
// ids at registration; Publish() exposes the segments under those ids through the transfer
// engine's SegmentTable, replacing any previous ids (after a re-registration the master has
// forgotten the old ones). Thread-safe after Create.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "transfer/transfer_engine.h"

namespace mc::client {

struct SegmentPoolOptions {
  uint64_t segment_size = 0;  // bytes per segment; 0 = no segments (a pure client)
  int segment_count = 1;
  bool huge_pages = false;    // try MAP_HUGETLB first
  bool prefault = false;      // touch every page at start (MAP_POPULATE)
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

 private:
  SegmentPool() = default;
  std::vector<Segment> segments_;
  std::vector<uint64_t> published_ids_;
};

}  // namespace mc::client
