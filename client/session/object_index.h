// ObjectIndex: the owner-side index of the objects in this daemon's memory segments.
//
// Per local segment (its position in SegmentPool::segments(), which outlives every registration
// while the master's segment ids change with each), a map offset -> {key, generation, size,
// checksum}. Writers tell the owner what they wrote (client/session/index_service.h) before they
// end the put; after every registration the session verifies the entries' bytes and reports them to
// the master (client/session/master_session.h), which rebuilds the objects a restart or an expiry
// made it forget. The index is a hint, never trusted for reads: an entry whose bytes no longer
// match its checksum is dropped at report time, and the master checks every reported range itself.
// It does not know segment ids, leases or replica states. A key -> location map (the entry last
// recorded for each key) serves Find() for the get path's speculative local copies
// (client/batch/speculative_copier.h), updated under the same mutex by every change, O(1) each.
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"

namespace mc::client {

struct IndexedObject {
  std::string key;
  uint64_t generation = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;  // XXH3-64 of the payload, as recorded at put
};

class ObjectIndex {
 public:
  // `segment_sizes[i]`: bytes of local segment i. `objects` (optional, borrowed) follows size().
  explicit ObjectIndex(std::vector<uint64_t> segment_sizes, Gauge* objects = nullptr);

  // Records `object` at [offset, offset + object.size) of local segment `local_index`, first
  // removing every entry overlapping that range (the bytes there are the new object's now).
  // INVALID_ARGUMENT for an unknown segment, an empty object or a range outside the segment.
  absl::Status Insert(size_t local_index, uint64_t offset, IndexedObject object);
  // Drops the entry starting at `offset` (the master freed that replica); false if none.
  bool Forget(size_t local_index, uint64_t offset);
  // Drops the entry at `offset` only while it still holds `generation` (a newer object written
  // there since the snapshot stays); false if none.
  bool Erase(size_t local_index, uint64_t offset, uint64_t generation);

  struct Entry {
    size_t local_index = 0;
    uint64_t offset = 0;
    IndexedObject object;
  };
  // Every entry, by segment then offset.
  std::vector<Entry> Snapshot() const;
  // The entry last recorded for `key`, while it is still in the index (a hint: the master's
  // answer and the checksum decide whether its bytes are the object's). Another replica of
  // the same key recorded earlier is not found once a later one was recorded.
  std::optional<Entry> Find(std::string_view key) const;
  size_t size() const;
  size_t segment_count() const { return segment_sizes_.size(); }

 private:
  void UpdateGauge() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops `key`'s location when it is (local_index, offset) (the entry there is going away).
  void UnmapKey(const std::string& key, size_t local_index, uint64_t offset)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<uint64_t> segment_sizes_;
  Gauge* const objects_;
  mutable absl::Mutex mu_;
  std::vector<std::map<uint64_t, IndexedObject>> segments_ ABSL_GUARDED_BY(mu_);
  // key -> (local segment, offset) of the entry last recorded for it.
  absl::flat_hash_map<std::string, std::pair<size_t, uint64_t>> by_key_ ABSL_GUARDED_BY(mu_);
  size_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mc::client
