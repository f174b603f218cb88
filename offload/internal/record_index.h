// The DiskTier's in-memory index: (key, generation) -> slot, with pin counts and an LRU order of
// the records that its own watermark eviction may reclaim (complete and unpinned). Pure
// bookkeeping, no I/O. Not thread-safe: DiskTier calls it under its mutex.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "offload/extent_allocator.h"

namespace mc::offload::internal {

struct Slot {
  bool ready = false;  // false while the record is being written
  Extent extent;       // valid once ready
  uint64_t payload_len = 0;
  uint64_t checksum = 0;  // XXH3-64 of the payload, valid once ready
  int pins = 0;
  uint64_t lru_tick = 0;  // key of lru_ while ready
};

struct IndexedRecord {
  std::string key;
  uint64_t generation = 0;
  Extent extent;
  uint64_t payload_len = 0;
  uint64_t checksum = 0;
};

class RecordIndex {
 public:
  Slot* Find(std::string_view key, uint64_t generation);
  // A new slot in the writing state; nullptr when (key, generation) is already present.
  Slot* InsertWriting(std::string_view key, uint64_t generation);
  // Completes a writing slot (or inserts a ready one at recovery).
  void MarkReady(std::string_view key, uint64_t generation, const Extent& extent,
                 uint64_t payload_len, uint64_t checksum);
  // Moves a ready slot to the most recently used end.
  void Touch(std::string_view key, uint64_t generation);
  void Pin(std::string_view key, uint64_t generation);
  void Unpin(std::string_view key, uint64_t generation);
  // Drops a slot (any state); false when absent.
  bool Erase(std::string_view key, uint64_t generation);
  // Removes least recently used evictable records until `bytes` (extent bytes) are covered or none
  // is left, and returns them.
  std::vector<IndexedRecord> TakeVictims(uint64_t bytes);
  // The records TakeVictims would take, left in place.
  std::vector<IndexedRecord> PeekVictims(uint64_t bytes) const;

  uint64_t evictable_bytes() const { return evictable_bytes_; }
  size_t ready_count() const { return lru_.size(); }
  std::vector<IndexedRecord> ListReady() const;

 private:
  using Key = std::pair<std::string, uint64_t>;
  static Key MakeKey(std::string_view key, uint64_t generation) {
    return Key(std::string(key), generation);
  }
  static bool Evictable(const Slot& s) { return s.ready && s.pins == 0; }
  void Account(const Slot& s, int sign);

  absl::flat_hash_map<Key, Slot> slots_;
  std::map<uint64_t, Key> lru_;  // ready slots by last use
  uint64_t next_tick_ = 1;
  uint64_t evictable_bytes_ = 0;
};

}  // namespace mc::offload::internal
