// The master's record of one object: state machine, replicas and read leases.
//
// PENDING (space allocated, writer moving bytes) -> COMPLETE (PutEnd recorded the checksum;
// readable). Only COMPLETE objects are returned by lookups. A lease is (id, expiry); an object
// with any live lease is neither evictable nor removable. Plain data guarded by its shard's lock
// in ObjectTable; helpers here take the current time explicitly, so tests drive them with a
// FakeClock.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <vector>

#include "master/segment_manager.h"

namespace mc::master {

enum class ObjectState { kPending, kComplete };
enum class ReplicaTier { kMemory, kDisk };

struct Replica {
  ReplicaTier tier = ReplicaTier::kMemory;
  MemoryLocation location;  // for DISK: client, endpoint, offset = the tier's record locator
};

struct Lease {
  uint64_t id = 0;
  int64_t expiry_ms = 0;
  uint64_t owner = 0;  // the granting caller's session (0: authentication off)
};

enum class LeaseRelease { kReleased, kNotHeld, kNotOwner };

struct Object {
  // Fields a lookup reads or writes come first: with the table's key before them they share the
  // entry's first two cache lines (an entry is ~360 bytes; a batch's lookups are cache misses).
  uint64_t size = 0;
  uint64_t checksum = 0;
  uint64_t generation = 0;
  ObjectState state = ObjectState::kPending;
  bool pinned = false;  // soft pin: never chosen by eviction
  // In its shard's `leased` index. Set at the first lease; cleared only by the lease sweep,
  // so a key leased and released again and again costs no index update.
  bool lease_indexed = false;
  int64_t last_access_ms = 0;
  uint64_t access_seq = 0;  // process-wide order of last access: exact LRU across shards
  std::list<std::string>::iterator lru_pos;  // position in the shard's LRU list
  std::vector<Replica> replicas;
  std::vector<Lease> leases;
  std::string key;
  std::string writer_client;
  int64_t put_start_ms = 0;
  uint32_t replicas_asked = 0;    // memory replicas the put placed (checked again at PutEnd)
  int64_t offload_queued_ms = 0;  // when an OFFLOAD task for it was queued (0 = none)
  // When a client last reported that it could not persist it (its SSD tier full or failing;
  // 0 = never). Until the planner's task timeout passes, eviction may drop it unpersisted.
  int64_t offload_failed_ms = 0;
  // A memory replica being written back from the SSD tier (not readable until PromoteEnd).
  struct Promotion {
    MemoryLocation location;
    std::string writer;
    int64_t start_ms = 0;
  };
  std::optional<Promotion> promotion;

  // Drops expired leases; returns how many.
  size_t PruneLeases(int64_t now_ms);
  bool HasLiveLease(int64_t now_ms) const;
  // Ends lease `id` if `owner` holds it: kReleased when it was live, kNotHeld when there is no
  // such lease (or it had expired), kNotOwner (nothing changes) when another owner holds it.
  LeaseRelease ReleaseLease(uint64_t id, uint64_t owner, int64_t now_ms);
  bool HasMemoryReplica() const;
  bool HasDiskReplicaOn(const std::string& client_id) const;
  bool HasDiskReplica() const;
};

}  // namespace mc::master
