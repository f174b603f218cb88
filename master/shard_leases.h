// ShardLeases: the read leases of one ObjectTable shard, kept beside the objects instead of in
// them.
//
// Why beside: a lease's release names keys. Finding a key's object in a table of millions loads
// the object's node (a cache miss per key) only to end a lease on it. So each lookup that leases
// objects also keeps, per shard, a grant record of what it leased: the objects in grant order and
// a copy of their keys (copied while the nodes are in cache). A release that names the granted
// keys in that order (what mc-client sends) is matched against the record, key by key, and ends
// each lease without loading a node. Anything else (another order, a key not granted, a lease id
// without a record) finds the object by key and ends the lease there, as before.
//
// Exactness. A record's entry names its object only while the lease granted there is held: every
// path that ends a lease (release, expiry seen by a prune or the sweep, the object's erasure)
// clears that entry. So an entry that still names an object is that object, never a node freed
// and reused, and its key is the copy's. A release answers exactly what the probe would
// (kReleased, kNotHeld, kNotOwner; expired leases are pruned and counted first).
//
// Bounds: a record lives while any of its leases is held (lease TTL, then the sweep); it holds one
// pointer, one offset and one copy of each granted key. Spare records are kept for reuse up to
// kSpareGrants, and only while small (kSpareGrantKeyBytes, kSpareGrantEntries). Not thread-safe:
// its shard's lock guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "master/object.h"

namespace mc::master {

class ShardLeases {
 public:
  // One inline: a key is usually leased by one reader at a time.
  using Leases = absl::InlinedVector<Lease, 1>;
  using ByObject = absl::flat_hash_map<const Object*, Leases>;

  // Empty grant records kept for the next lookups, and the largest one kept (its keys' bytes and
  // entries): at most ~28 KiB each, so under 1 MiB per shard.
  static constexpr size_t kSpareGrants = 32;
  static constexpr size_t kSpareGrantKeyBytes = 16 * 1024;
  static constexpr size_t kSpareGrantEntries = 1024;

  ShardLeases() = default;
  ShardLeases(const ShardLeases&) = delete;
  ShardLeases& operator=(const ShardLeases&) = delete;

  // Grants `lease` on `object` (whose key is `key`) after dropping the object's expired leases;
  // returns how many were dropped. The lease's `slot` is set here.
  size_t Grant(const Object* object, std::string_view key, const Lease& lease, int64_t now_ms);

  // Ends lease `id` on the object granted next under it, if that object's key is `key` (the
  // record's next entry): the answer of Release below, without loading the object. nullopt when
  // the record cannot tell (no record, or its next key is another): the caller finds the object
  // by key and calls Release.
  std::optional<LeaseRelease> ReleaseGranted(uint64_t id, std::string_view key, uint64_t owner,
                                             int64_t now_ms, size_t* expired);

  // Drops the object's expired leases (adds how many to *expired), then ends lease `id` if
  // `owner` holds it: kReleased when it was live, kNotHeld when there is no such lease (or it had
  // expired), kNotOwner (nothing changes) when another owner holds it.
  LeaseRelease Release(const Object* object, uint64_t id, uint64_t owner, int64_t now_ms,
                       size_t* expired);

  // The object's leases (empty if none), and whether one is live.
  const Leases& Of(const Object* object) const;
  bool HasLive(const Object* object, int64_t now_ms) const;
  // Whether the object has any lease entry (expired ones the sweep has not seen included).
  bool Holds(const Object* object) const { return by_object_.contains(object); }

  // Drops every lease of `object` (it is being erased).
  void Forget(const Object* object);

  // Drops every expired lease; calls unleased(object) for each object left without a lease.
  // Returns how many leases expired.
  template <typename Fn>
  size_t Sweep(int64_t now_ms, Fn&& unleased) {
    size_t expired = 0;
    for (auto it = by_object_.begin(); it != by_object_.end();) {
      expired += Prune(it->second, now_ms);
      if (it->second.empty()) {
        unleased(it->first);
        by_object_.erase(it++);
      } else {
        ++it;
      }
    }
    return expired;
  }

  // The leased objects (those with a lease entry, expired ones the sweep has not seen included).
  const ByObject& objects() const { return by_object_; }
  // Grant records alive (each holds at least one lease), and spare ones (for tests).
  size_t GrantCount() const { return grants_.size(); }
  size_t SpareGrantCountForTest() const { return spare_.size(); }

 private:
  // What one lease id leased in this shard, in grant order.
  struct GrantRecord {
    std::vector<const Object*> objects;  // null once the lease granted there ended
    std::vector<uint32_t> key_ends;      // key i is keys[key_ends[i-1] (0 for i = 0), key_ends[i])
    std::string keys;
    size_t held = 0;    // non-null objects
    size_t cursor = 0;  // the entry the next release is expected to name

    std::string_view KeyAt(size_t i) const {
      const size_t begin = i == 0 ? 0 : key_ends[i - 1];
      return std::string_view(keys).substr(begin, key_ends[i] - begin);
    }
  };

  // The position in `leases` of lease `id` granted at record entry `slot` (it is there).
  static size_t IndexOf(const Leases& leases, uint64_t id, size_t slot);
  // Removes expired leases from `leases` (each one's record entry cleared); returns how many.
  size_t Prune(Leases& leases, int64_t now_ms);
  // Clears the record entry of `lease` (which is being removed from its object).
  void Ended(const Lease& lease);
  // Removes leases[i] (its record entry cleared) and the object's entry if none is left.
  void Remove(ByObject::iterator it, size_t i);
  std::unique_ptr<GrantRecord> TakeSpare();

  ByObject by_object_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<GrantRecord>> grants_;
  std::vector<std::unique_ptr<GrantRecord>> spare_;
};

}  // namespace mc::master
