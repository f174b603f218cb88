// The master's record of one object: state machine and replicas (its read leases are kept by
// its shard: ShardLeases).
//
// PENDING (space allocated, writer moving bytes) -> COMPLETE (PutEnd recorded the checksum;
// readable). Only COMPLETE objects are returned by lookups. A lease is (id, expiry, owner), kept
// by the object's shard (ShardLeases); an object with any live lease is neither evictable nor
// removable. Plain data guarded by its shard's lock in ObjectTable; helpers here take the current
// time explicitly, so tests drive them with a FakeClock.
//
// Layout (master memory per object). The table holds millions of objects, so an
// Object keeps only what every stored object needs: its numbers, its replicas in compact form
// (StoredReplica: the client and endpoint as a 32-bit PeerNames index, the first one inline),
// the links of its shard's LRU list, and its key, stored once, in the same allocation right
// after the Object (ObjectTable allocates the node; key() is valid only for an Object there).
// What only a put, promotion or offload in progress needs lives in a Transient record
// allocated on demand and freed (TrimTransient) once it holds nothing.
//
// One writer (no path changes an object behind its shard's lock): a stored Object is changed only
// by its ObjectTable shard's named operations (ObjectTable::Shard: Insert, Erase, Touch,
// AddReplica, CompletePut, GrantLease...). Everyone else sees `const Object&` (the table's
// iterators and LRU walks hand out nothing else) and the mutators below are private to the table,
// so the compiler refuses any other writer. The public fields are read freely, and set directly
// only on a fresh Object that is about to be handed to Shard::Insert.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "master/peer_names.h"
#include "master/segment_manager.h"

namespace mc::master {

enum class ObjectState : uint8_t { kPending, kComplete };
enum class ReplicaTier : uint8_t { kMemory, kDisk };

// A replica as the master's API hands it out (lookups, puts, promotions).
struct Replica {
  ReplicaTier tier = ReplicaTier::kMemory;
  MemoryLocation location;  // for DISK: client, endpoint, offset = the tier's record locator
};

// A replica as the object table stores it: the same fields, the client id and endpoint interned
// (PeerNames), 40 bytes instead of a Replica's ~96 and no allocation of its own.
struct StoredReplica {
  uint64_t segment_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t generation = 0;  // MemoryLocation::generation
  uint32_t peer = 0;        // PeerNames index of (client id, endpoint)
  ReplicaTier tier = ReplicaTier::kMemory;

  static StoredReplica Of(const Replica& replica);
  static StoredReplica Of(ReplicaTier tier, const MemoryLocation& location) {
    return Of(Replica{tier, location});
  }
  const std::string& client_id() const { return PeerNames::Instance().Get(peer).client_id; }
  MemoryLocation location() const;
};

struct Lease {
  uint64_t id = 0;
  int64_t expiry_ms = 0;
  uint64_t owner = 0;  // the granting caller's session (0: authentication off)
  uint32_t slot = 0;   // its entry in the shard's grant record of `id` (ShardLeases)
};

enum class LeaseRelease { kReleased, kNotHeld, kNotOwner };

class Object {
 public:
  // A memory replica being written back from the SSD tier (not readable until PromoteEnd).
  struct Promotion {
    MemoryLocation location;
    std::string writer;
    int64_t start_ms = 0;
  };
  // State that only a put, promotion or offload in progress needs (leases are kept by the
  // shard: ShardLeases).
  struct Transient {
    int64_t put_start_ms = 0;
    uint32_t replicas_asked = 0;    // memory replicas the put placed (checked again at PutEnd)
    int64_t offload_queued_ms = 0;  // when an OFFLOAD task for it was queued (0 = none)
    // When a client last reported that it could not persist it (its SSD tier full or failing;
    // 0 = never). Until the planner's task timeout passes, eviction may drop it unpersisted.
    int64_t offload_failed_ms = 0;
    std::unique_ptr<Promotion> promotion;

    bool Empty() const {
      return put_start_ms == 0 && replicas_asked == 0 && offload_queued_ms == 0 &&
             offload_failed_ms == 0 && promotion == nullptr;
    }
  };
  using Replicas = absl::InlinedVector<StoredReplica, 1>;

  Object() = default;
  // Moves build the fields of a new object before ObjectTable stores it; a copy would not carry
  // the key (which lives after the table's node), so there is none.
  Object(Object&& other) noexcept = default;
  Object& operator=(Object&& other) noexcept = default;
  Object(const Object&) = delete;
  Object& operator=(const Object&) = delete;

  // Fields a lookup reads or writes come first, in the node's first cache line.
  uint64_t size = 0;
  uint64_t checksum = 0;
  uint64_t generation = 0;
  // Process-wide order of last access (insert, put end, read): orders eviction candidates
  // across shards. The LRU list itself moves only at insert, put end and SecondChance.
  uint64_t access_seq = 0;
  ObjectState state = ObjectState::kPending;
  bool pinned = false;  // soft pin: never chosen by eviction
  // May have leases in its shard's ShardLeases: set at each lease; cleared only where the node is
  // read anyway (a release that finds the object by key, the lease sweep), so it may stay set
  // after the last lease ended (a release matched by its grant record does not load the node).
  // Clear: no lease.
  bool maybe_leased = false;
  // Read (ObjectTable::Shard::MarkRead) since it was last placed at the front of its shard's LRU
  // list: the list is not reordered by reads; eviction gives such an object a second chance
  // (Shard::SecondChance) instead. Fills padding: the Object's size is unchanged.
  bool lru_read = false;
  // PeerNames index of the client that put it (0 = none: rebuilt from a report). Kept after the
  // put ends: a repeated PutEnd by the same writer is answered again.
  uint32_t writer = 0;
  Replicas replicas;

  // The key, stored after the node (empty for an Object not in a table).
  std::string_view key() const {
    return {reinterpret_cast<const char*>(this + 1), static_cast<size_t>(key_size_.value)};
  }
  const std::string& writer_client() const { return PeerNames::Instance().Get(writer).client_id; }

  // The transient record, if any.
  const Transient* transient() const { return transient_.get(); }
  bool has_transient() const { return transient_ != nullptr; }
  int64_t put_start_ms() const { return transient_ ? transient_->put_start_ms : 0; }
  uint32_t replicas_asked() const { return transient_ ? transient_->replicas_asked : 0; }
  int64_t offload_queued_ms() const { return transient_ ? transient_->offload_queued_ms : 0; }
  int64_t offload_failed_ms() const { return transient_ ? transient_->offload_failed_ms : 0; }
  // The promotion in progress, or null.
  const Promotion* promotion() const { return transient_ ? transient_->promotion.get() : nullptr; }
  bool HasMemoryReplica() const;
  bool HasDiskReplicaOn(const std::string& client_id) const;
  bool HasDiskReplica() const;

  // The shard's LRU list (ObjectTable): the next more recently used object, and the next less
  // recently used one (null at the ends).
  const Object* lru_newer() const { return lru_newer_; }
  const Object* lru_older() const { return lru_older_; }

 private:
  friend class ObjectMap;
  friend class ObjectTable;

  // The mutators, for ObjectTable::Shard only (see "One writer" above).
  // The transient record, allocated if there is none.
  Transient& MutableTransient();
  // Frees the transient record once nothing in it is set.
  void TrimTransient();
  void StartPromotion(Promotion promotion);
  void EndPromotion();

  // Links and key length of the table's node. A moved Object starts unlinked and keyless.
  template <typename T>
  struct NodeField {
    T value{};
    NodeField() = default;
    NodeField(NodeField&&) noexcept {}
    NodeField& operator=(NodeField&&) noexcept { return *this; }
    operator T() const { return value; }
    NodeField& operator=(T v) {
      value = v;
      return *this;
    }
  };

  NodeField<uint32_t> key_size_;  // set by ObjectMap for the node only
  NodeField<Object*> lru_newer_;
  NodeField<Object*> lru_older_;
  std::unique_ptr<Transient> transient_;
};

}  // namespace mc::master
