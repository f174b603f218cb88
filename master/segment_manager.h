// SegmentManager: the memory segments clients contribute, their allocators, and replica placement.
//
// Owns one OffsetAllocator per segment. Place() puts the replicas of one object on distinct
// clients: the writer's own client first when it has room, then the others by most free space;
// within a client, the segment whose best fit succeeds with the most free space. It never evicts:
// a NO_SPACE answer sends the caller to the Evictor. Segment ids are never reused, so a Free()
// that names a segment removed meanwhile (its client died) is a harmless no-op.
// Free-space index: clients ordered by free bytes, and each client's segments ordered by free
// bytes, kept current on every allocation and free (O(log n)), so a placement visits clients and
// segments from the most free down and stops at the first that fit: its cost does not grow with
// the number of clients or segments that have no room (junk or full ones), only with those it
// has to skip because fragmentation leaves no single range large enough.
// Thread-safe: one internal mutex; never calls out while holding it.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "master/offset_allocator.h"

namespace mc::master {

// Where one memory replica lives.
struct MemoryLocation {
  std::string client_id;
  std::string endpoint;
  uint64_t segment_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct SegmentStats {
  uint64_t capacity = 0;
  uint64_t used = 0;
  uint64_t segments = 0;
};

class SegmentManager {
 public:
  explicit SegmentManager(uint64_t alignment = 64) : alignment_(alignment) {}

  // Adds a segment of `size` bytes owned by `client_id`; returns its new id (never reused).
  uint64_t AddSegment(const std::string& client_id, const std::string& endpoint, uint64_t size);
  // Drops every segment of the client; returns how many.
  size_t RemoveClient(const std::string& client_id);

  // Allocates `replicas` ranges of `size` bytes on distinct clients, or kNoSpace with nothing held.
  absl::StatusOr<std::vector<MemoryLocation>> Place(uint64_t size, uint32_t replicas,
                                                    const std::string& preferred_client);
  // Frees a placed range. No-op when its segment is gone.
  void Free(const MemoryLocation& location);

  // OK when `replicas` distinct clients each own a segment large enough for `size` bytes, so
  // that eviction could make room; otherwise kNoSpace saying why (no eviction can help).
  absl::Status CouldEverPlace(uint64_t size, uint32_t replicas) const;
  SegmentStats Stats() const;
  SegmentStats ClientStats(const std::string& client_id) const;
  // The largest single free range over all segments.
  uint64_t LargestFree() const;

 private:
  struct Segment {
    std::string client_id;
    std::string endpoint;
    OffsetAllocator allocator;
  };
  struct ClientSpace {
    std::vector<uint64_t> ids;
    uint64_t free_bytes = 0;
    std::set<std::pair<uint64_t, uint64_t>> by_free;  // (free bytes, segment id)
  };
  // Best segment of one client for `size`: the one with most free bytes whose best fit succeeds.
  bool AllocateOnClientLocked(const std::string& client_id, uint64_t size, MemoryLocation* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `change` on segment `id`'s allocator and brings used_ and the free-space index up to
  // date with its effect.
  template <typename F>
  auto ChangeLocked(uint64_t id, Segment& seg, F change) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t alignment_;
  mutable absl::Mutex mu_;
  uint64_t next_segment_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Segment> segments_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, ClientSpace> by_client_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<uint64_t, std::string>> clients_by_free_ ABSL_GUARDED_BY(mu_);
  uint64_t capacity_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mc::master
