// Space management for the SSD tier: 4 KiB-aligned extents over N preallocated data files.
//
// Best-fit with coalescing: free extents are indexed by (length, file, offset) for the fit and by
// (file, offset) for merging with neighbours, so Allocate and Free are O(log n). Extents never
// span files. Pure bookkeeping, no I/O. MarkUsed() rebuilds the state from records found on disk
// at recovery. Not thread-safe: the owner (DiskTier) serializes calls.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace mc::offload {

inline constexpr uint64_t kPageSize = 4096;

inline constexpr uint64_t RoundUpToPage(uint64_t n) {
  return (n + kPageSize - 1) / kPageSize * kPageSize;
}
inline constexpr uint64_t RoundDownToPage(uint64_t n) { return n / kPageSize * kPageSize; }

struct Extent {
  uint32_t file = 0;
  uint64_t offset = 0;  // multiple of kPageSize
  uint64_t length = 0;  // multiple of kPageSize, > 0
  friend bool operator==(const Extent&, const Extent&) = default;
};

class ExtentAllocator {
 public:
  // One entry per data file: its usable size (rounded down to kPageSize).
  explicit ExtentAllocator(const std::vector<uint64_t>& file_sizes);

  // The smallest free extent that fits `length` rounded up to kPageSize (lowest file and offset on
  // ties); nullopt when none does or length is 0.
  std::optional<Extent> Allocate(uint64_t length);

  // Returns an allocated extent. Rejects (kInvalidArgument, state unchanged) an extent out of
  // range, unaligned, or overlapping free space (a double free).
  absl::Status Free(const Extent& extent);

  // Marks an extent as allocated (recovery). Rejects one that is not entirely free.
  absl::Status MarkUsed(const Extent& extent);

  uint64_t used() const { return capacity_ - free_bytes_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t free_bytes() const { return free_bytes_; }
  // The largest single extent Allocate could return now.
  uint64_t largest_free() const;
  size_t free_extent_count() const { return by_pos_.size(); }
  uint64_t file_size(uint32_t file) const {
    return file < file_sizes_.size() ? file_sizes_[file] : 0;
  }
  size_t num_files() const { return file_sizes_.size(); }

 private:
  using Pos = std::pair<uint32_t, uint64_t>;                 // file, offset
  using SizeKey = std::tuple<uint64_t, uint32_t, uint64_t>;  // length, file, offset

  bool ValidShape(const Extent& e) const;
  void InsertFree(uint32_t file, uint64_t offset, uint64_t length);
  void EraseFree(std::map<Pos, uint64_t>::iterator it);

  std::vector<uint64_t> file_sizes_;
  uint64_t capacity_ = 0;
  uint64_t free_bytes_ = 0;
  std::map<Pos, uint64_t> by_pos_;  // free extents: start -> length
  std::set<SizeKey> by_size_;
};

}  // namespace mc::offload
