// SegmentTable: the memory segments this process owns, looked up by id; shared by the local
// transport, the cuda transport, the rdma transport (which serves their rkeys) and the
// data-plane server. Thread-safe. A segment must stay mapped while any transfer may touch it
// (Remove() does not wait).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace mc::transfer {

class SegmentTable {
 public:
  // Adds or replaces a segment of `size` bytes at `base` (borrowed; must outlive its entry).
  void Add(uint64_t segment_id, char* base, uint64_t size);
  void Remove(uint64_t segment_id);
  void Clear();
  // The memory range [offset, offset+length) of a segment, or an error: kNotFound for an
  // unknown segment, kInvalidArgument for a range out of bounds or overflowing.
  absl::StatusOr<char*> Resolve(uint64_t segment_id, uint64_t offset, uint64_t length) const;
  struct Entry {
    uint64_t segment_id;
    char* base;
    uint64_t size;
  };
  // Every segment (the rdma transport tells peers the rkeys of these).
  std::vector<Entry> List() const;

 private:
  struct Segment {
    char* base;
    uint64_t size;
  };
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Segment> segments_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mc::transfer
