// OffsetAllocator: places byte ranges inside one segment of a fixed capacity.
//
// Best-fit over free ranges kept in two ordered indexes (by size, by offset), so Allocate, Free
// and the coalescing of free neighbours are O(log n). A free range is never split into pieces
// smaller than requested, and Allocate fails only when no single free range is large enough:
// fragmentation alone never fails a request that fits somewhere. Alignment: every range starts
// at a multiple of `alignment` (sizes are rounded up to it).
// Not thread-safe: SegmentManager guards each allocator with its own lock.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"

namespace mc::master {

class OffsetAllocator {
 public:
  explicit OffsetAllocator(uint64_t capacity, uint64_t alignment = 64);

  // The offset of a new range of `size` bytes (rounded up to the alignment), or nullopt.
  std::optional<uint64_t> Allocate(uint64_t size);
  // Reserves exactly [offset, offset + size rounded up to the alignment): the range a replica
  // already occupies (an owner's report after a master restart). False (and no change) when
  // `offset` is not aligned, `size` is 0, the range leaves the segment or overlaps any
  // allocated range. O(log n).
  bool AllocateAt(uint64_t offset, uint64_t size);
  // Frees a range returned by Allocate or AllocateAt. False (and no change) for an unknown offset.
  bool Free(uint64_t offset);

  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return used_; }
  uint64_t free_bytes() const { return capacity_ - used_; }
  uint64_t largest_free() const;
  size_t free_range_count() const { return free_by_offset_.size(); }
  size_t allocation_count() const { return allocated_.size(); }
  // The rounded size of the allocation at `offset`, 0 if none.
  uint64_t AllocatedSize(uint64_t offset) const;

 private:
  void InsertFree(uint64_t offset, uint64_t size);
  void EraseFree(absl::btree_map<uint64_t, uint64_t>::iterator it);

  const uint64_t capacity_;
  const uint64_t alignment_;
  uint64_t used_ = 0;
  // B-trees (~20 bytes an entry instead of a red-black node's 64): one allocation per stored
  // replica lives in allocated_ (the master keeps millions of objects: bytes per object count). No
  // iterator is kept across a change of its tree.
  absl::btree_map<uint64_t, uint64_t> free_by_offset_;           // offset -> size
  absl::btree_set<std::pair<uint64_t, uint64_t>> free_by_size_;  // (size, offset)
  absl::btree_map<uint64_t, uint64_t> allocated_;                // offset -> rounded size
};

}  // namespace mc::master
