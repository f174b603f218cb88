// The master's domain types: its options and the items and outcomes of its calls, free of gRPC
// and protobuf (master/grpc_service.cc maps them to and from the wire). Plain values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "master/client_registry.h"
#include "master/evictor.h"
#include "master/object.h"
#include "master/offload_planner.h"
#include "master/segment_manager.h"

namespace mc::master {

// The keys of a batch's items (any item type with a `key`), in order; views into `items`.
template <typename Items>
std::vector<std::string_view> ItemKeys(const Items& items) {
  std::vector<std::string_view> keys;
  keys.reserve(items.size());
  for (const auto& item : items) keys.push_back(item.key);
  return keys;
}

struct MasterOptions {
  int64_t lease_ttl_ms = 5000;           // default read-lease TTL
  int64_t max_lease_ttl_ms = 600'000;    // longest TTL a caller may ask for
  int64_t client_ttl_ms = 10'000;        // a client silent this long is dead
  int64_t heartbeat_interval_ms = 1000;  // told to clients
  int64_t put_timeout_ms = 60'000;       // PENDING puts older than this are revoked
  uint64_t max_object_size = 1ull << 30;
  uint32_t max_replicas = 8;
  size_t shards = 32;
  uint64_t alignment = 64;  // allocation granularity inside segments
  // Segments a client may register: each at least min_segment_size and at most
  // max_segment_size bytes, at most max_segments_per_client of them. Keeps placement cost
  // independent of junk (tiny or countless) segments and every capacity sum far from 2^64.
  uint64_t min_segment_size = 64 << 10;
  uint64_t max_segment_size = 1ull << 46;  // 64 TiB
  size_t max_segments_per_client = 256;
  int sync_eviction_rounds = 8;  // PutStart evicts and retries this often before NO_SPACE
  // Authenticated registrations only (RegistrationAuth::bound): a registration for an id with a
  // live session that does not present that session's token (a restarted daemon, or a second
  // daemon configured with the same --client_id) replaces it only once the session has been
  // silent (no heartbeat) this long; until then it is refused UNAVAILABLE and the daemon retries.
  int64_t client_takeover_after_ms = 3000;
  // This run's epoch (the high 32 bits of its segment ids); 0 = random (nonzero).
  uint32_t epoch = 0;
  // A client that registered with will_report_objects gets new placements in its segments again
  // at its report's last chunk, or this long after its registration at the latest.
  int64_t object_report_timeout_ms = 30'000;
  size_t forget_batch = 65536;          // forgotten ranges per heartbeat answer
  size_t forget_queue_limit = 1 << 20;  // forgotten ranges queued per client (oldest dropped)
  EvictorOptions eviction;
  OffloadPlannerOptions offload;
};

struct Registration {
  uint64_t session = 0;
  uint64_t epoch = 0;  // this master run's (MetadataService::epoch())
  std::string token;   // the session's bearer token (ClientRegistry)
  std::vector<uint64_t> segment_ids;
};

// How a registration was authenticated (MasterGrpcService). bound=false (authentication off,
// or the in-process tests): a registration replaces a live session of the same id at once, as
// it always did.
struct RegistrationAuth {
  bool bound = false;
  std::string previous_token;  // the live session's token, when the caller presented one
};

struct PutStartItem {
  std::string_view key;
  uint64_t size = 0;
};
struct PutStartOutcome {
  absl::Status status;
  uint64_t generation = 0;
  std::vector<Replica> replicas;
  bool no_space_final = false;  // NO_SPACE no eviction can cure (SegmentManager::CouldEverPlace)
  bool write_back_pending = false;  // NO_SPACE until write-backs to SSD end (retry shortly)
};
struct PutEndItem {
  std::string_view key;
  uint64_t generation = 0;
  uint64_t checksum = 0;
};
struct PutRevokeItem {
  std::string_view key;
  uint64_t generation = 0;
};
// A promotion of an SSD-only object back to memory (PromoteStart, PromoteEnd): the object's key
// and the generation its reader found.
struct PromoteItem {
  std::string_view key;
  uint64_t generation = 0;
};

struct LookupOptions {
  int64_t lease_ttl_ms = 0;         // 0 = default
  bool stop_at_first_miss = false;  // prefix match
  bool grant_lease = true;
  bool with_replicas = true;  // false: code, size, checksum, generation only
  // A read: moves the found keys to the LRU front. A count-only probe (unleased MatchPrefix)
  // is not a read, as Exist is not: it leaves recency alone.
  bool touch = true;
  // Who owns the leases granted (the caller's session; 0 = nobody in particular, authentication
  // off): only the same owner releases them (ReleaseLeases).
  uint64_t lease_owner = 0;
};
struct LookupOutcome {
  absl::Status status;
  uint64_t size = 0;
  uint64_t checksum = 0;
  uint64_t generation = 0;
  // Memory replicas first, as the table stores them (the client id and endpoint a PeerNames
  // index: a lookup copies no string). One inline: most objects have one replica, and a lookup
  // of 1,024 keys allocated 1,024 vectors here.
  absl::InlinedVector<StoredReplica, 1> replicas;
};
struct LookupBatch {
  uint64_t lease_id = 0;
  int64_t lease_ttl_ms = 0;
  std::vector<LookupOutcome> results;
};

struct DiskReplicaItem {
  std::string_view key;
  uint64_t generation = 0;
  uint64_t locator = 0;
  uint64_t length = 0;
  uint64_t checksum = 0;
};

// A reader's report of a bad replica or an unreachable holder (master.proto ReportReplicaFaults).
enum class ReplicaFault : uint8_t { kCorrupt, kUnreachable };
struct ReplicaFaultItem {
  ReplicaFault fault = ReplicaFault::kCorrupt;
  std::string_view key;  // kCorrupt: the object, its generation and the replica's place
  uint64_t generation = 0;
  std::string holder;  // the replica's client id
  uint64_t segment_id = 0;
  uint64_t offset = 0;
};

// One object of an owner's report (ReportObjects): a COMPLETE memory replica in one of its
// segments.
struct ReportedObjectItem {
  std::string_view key;
  uint64_t generation = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
  uint64_t segment_id = 0;
  uint64_t offset = 0;
};

struct MasterSnapshot {
  uint64_t mem_used = 0;
  uint64_t mem_capacity = 0;
  uint64_t keys = 0;
  uint64_t clients = 0;
  uint64_t disk_used = 0;
  uint64_t disk_capacity = 0;
  EvictionStats eviction;
  uint64_t lost_ssd_reclaimed = 0;  // objects whose last copy, on SSD, its tier reclaimed
};

}  // namespace mc::master
