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
// Segment ids are (epoch << 32) | counter: the master run's epoch in the high bits and a counter
// from 1 that never repeats within the run, so ids never repeat across runs either (a stale
// writer's frame aimed at a previous run's segment finds no such segment).
// Held clients (a client reporting its objects after registering, MetadataService::
// ReportObjects): their segments are left out of placement (not even as the preferred client)
// until Release(); AllocateAt() still reserves the exact ranges of reported replicas in them.
// Forget queue: every range Free() gives back in a segment that still exists is queued for the
// segment's owner ({segment, offset, generation}, at most forget_queue_limit per client, the oldest
// dropped beyond it), taken by TakeForgotten(); a client's queue goes with its segments
// (RemoveClient). Thread-safe: one internal mutex; never calls out while holding it.
#pragma once

#include <cstdint>
#include <deque>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "master/offset_allocator.h"

namespace mc::master {

// Where one memory replica lives.
struct MemoryLocation {
  std::string client_id;
  std::string endpoint;
  uint64_t segment_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  // MEMORY replicas: the generation of the object it holds, set when the replica is attached
  // (0 = none yet). It goes with the range into the owner's forget queue, so the owner drops
  // only that object's index entry, never a later object's that reused the range.
  uint64_t generation = 0;
};

struct SegmentStats {
  uint64_t capacity = 0;
  uint64_t used = 0;
  uint64_t segments = 0;
};

// A memory range the master freed, as the owner names it (HeartbeatResponse.forgotten).
struct ReplicaRef {
  uint64_t segment_id = 0;
  uint64_t offset = 0;
  uint64_t generation = 0;  // MemoryLocation::generation of the freed range (0 = unknown)
  bool operator==(const ReplicaRef&) const = default;
};

// Segment ids a run assigns: counters 1 .. 2^32 - 1 under one epoch.
inline constexpr uint64_t kSegmentCounterLimit = 1ull << 32;

struct SegmentManagerOptions {
  uint64_t alignment = 64;
  uint32_t epoch = 0;                      // high 32 bits of every segment id
  size_t forget_queue_limit = 1ull << 20;  // queued forgotten ranges per client
  Counter* forget_dropped = nullptr;       // counts ranges dropped past the limit (may be null)
  uint64_t first_segment_counter = 1;      // tests start near exhaustion
};

class SegmentManager {
 public:
  explicit SegmentManager(uint64_t alignment = 64)
      : SegmentManager(SegmentManagerOptions{.alignment = alignment}) {}
  explicit SegmentManager(const SegmentManagerOptions& options);

  // Adds a segment of `size` bytes owned by `client_id`; returns its new id (never reused), or 0
  // when this run's segment ids are exhausted.
  uint64_t AddSegment(const std::string& client_id, const std::string& endpoint, uint64_t size);
  // Adds all segments of one registration at once, held (no placement until Release) when
  // `held` (a client without segments has nothing to hold); kInternal with nothing added when
  // they would exhaust this run's segment ids.
  absl::StatusOr<std::vector<uint64_t>> AddClientSegments(const std::string& client_id,
                                                          const std::string& endpoint,
                                                          const std::vector<uint64_t>& sizes,
                                                          bool held);
  // Drops every segment of the client, and its forget queue; returns how many segments.
  size_t RemoveClient(const std::string& client_id);
  // Opens a held client's segments to placement again; false when it was not held.
  bool Release(const std::string& client_id);
  bool IsHeld(const std::string& client_id) const;

  // Reserves each range exactly (OffsetAllocator::AllocateAt) in a segment `client_id` owns;
  // fills in each reserved location's client and endpoint. One status per range:
  // INVALID_ARGUMENT for a segment that is not the client's, or a range that is unaligned,
  // outside the segment or overlapping an allocated range.
  std::vector<absl::Status> AllocateAt(const std::string& client_id,
                                       std::vector<MemoryLocation>& ranges);
  // Up to `max` of the client's forgotten ranges, oldest first; `*more`: some remain queued.
  std::vector<ReplicaRef> TakeForgotten(const std::string& client_id, size_t max, bool* more);

  // Allocates `replicas` ranges of `size` bytes on distinct clients, none of them in `avoid`, or
  // kNoSpace with nothing held.
  absl::StatusOr<std::vector<MemoryLocation>> Place(uint64_t size, uint32_t replicas,
                                                    const std::string& preferred_client,
                                                    const std::vector<std::string>& avoid = {});
  // Frees a placed range and queues it for its owner's forget queue. No-op when its segment is
  // gone.
  void Free(const MemoryLocation& location);

  // OK when `replicas` distinct clients that are not held each own a segment large enough for
  // `size` bytes, so that eviction could make room; otherwise kNoSpace saying why. Held clients
  // do not count: eviction cannot open their segments. When they would make up the number,
  // `*wait_for_held` (optional) is set: the answer changes once their reports end (retry).
  // Clients in `avoid` do not count.
  absl::Status CouldEverPlace(uint64_t size, uint32_t replicas, bool* wait_for_held = nullptr,
                              const std::vector<std::string>& avoid = {}) const;
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
    bool held = false;  // out of clients_by_free_ (and so of placement) while set
    std::deque<ReplicaRef> forgotten;
  };
  // Best segment of one client for `size`: the one with most free bytes whose best fit succeeds.
  bool AllocateOnClientLocked(const std::string& client_id, uint64_t size, MemoryLocation* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `change` on segment `id`'s allocator and brings used_ and the free-space index up to
  // date with its effect.
  template <typename F>
  auto ChangeLocked(uint64_t id, Segment& seg, F change) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  uint64_t AddSegmentLocked(const std::string& client_id, const std::string& endpoint,
                            uint64_t size, bool held) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t alignment_;
  const uint64_t epoch_bits_;  // epoch << 32
  const size_t forget_queue_limit_;
  Counter* const forget_dropped_;
  mutable absl::Mutex mu_;
  uint64_t next_counter_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Segment> segments_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, ClientSpace> by_client_ ABSL_GUARDED_BY(mu_);
  // Clients open to placement (not held), by free bytes.
  std::set<std::pair<uint64_t, std::string>> clients_by_free_ ABSL_GUARDED_BY(mu_);
  uint64_t capacity_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mc::master
