// ObjectTable: every object the master knows, sharded by key hash.
//
// Each shard has its own mutex, map and LRU list (most recently used at the front). Batched
// calls group their keys by shard and take each shard's lock once per batch (ForKeys); scans
// (eviction, liveness, lease sweeps) visit one shard at a time and never hold two shard locks.
// Lock order: a shard lock may be held while taking SegmentManager's lock, never the reverse.
// Thread-safe.
//
// One writer (so that no path can change an object behind its shard's lock): the table is the only
// writer of object state. Every change of a stored object is one of Shard's named operations below
// (create, erase, touch, replicas, put end, promotion, offload marks, leases); its iterators and
// LRU walks hand out `const Object&` only, and Object's mutators are private to the table, so any
// other writer fails to compile. A journal, an audit counter or a consistency check of object state
// hooks in here, in one place.
//
// Memory (millions of objects per master): an object is one heap node, an Object followed by its
// key's bytes (the key is stored once); a shard's map is a flat set of pointers to the nodes, found
// by key, and its LRU list is intrusive (the links are in the Object). See object.h for the
// Object's layout.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/synchronization/mutex.h"
#include "master/object.h"
#include "master/shard_leases.h"

namespace mc::master {

// A key for heterogeneous lookups in the table's maps (no temporary std::string).
inline absl::string_view AsKey(std::string_view key) { return {key.data(), key.size()}; }

// One shard's objects by key: owns the nodes (Object + key bytes). Map-like: find() answers an
// iterator whose `->first` is the key and `->second` the Object (const: changes go through
// ObjectTable::Shard). Not thread-safe (its shard's lock guards it).
class ObjectMap {
 private:
  struct NodeHash {
    using is_transparent = void;
    size_t operator()(absl::string_view key) const { return absl::Hash<absl::string_view>()(key); }
    size_t operator()(const Object* o) const { return (*this)(AsKey(o->key())); }
  };
  struct NodeEq {
    using is_transparent = void;
    static absl::string_view KeyOf(absl::string_view key) { return key; }
    static absl::string_view KeyOf(const Object* o) { return AsKey(o->key()); }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return KeyOf(a) == KeyOf(b);
    }
  };
  using Set = absl::flat_hash_set<Object*, NodeHash, NodeEq>;

 public:
  // What an iterator points at: the node's key and Object.
  struct Entry {
    std::string_view first;
    const Object& second;
  };
  class iterator {
   public:
    iterator() = default;
    Entry operator*() const { return {(*it_)->key(), **it_}; }
    // `it->second` works as for a map: the proxy holds the Entry for the full expression.
    struct Arrow {
      Entry entry;
      const Entry* operator->() const { return &entry; }
    };
    Arrow operator->() const { return Arrow{**this}; }
    const Object* object() const { return *it_; }
    iterator& operator++() {
      ++it_;
      return *this;
    }
    iterator operator++(int) {
      iterator before = *this;
      ++it_;
      return before;
    }
    bool operator==(const iterator& other) const { return it_ == other.it_; }
    bool operator!=(const iterator& other) const { return it_ != other.it_; }

   private:
    friend class ObjectMap;
    explicit iterator(Set::iterator it) : it_(it) {}
    Set::iterator it_;
  };

  ObjectMap() = default;
  ObjectMap(const ObjectMap&) = delete;
  ObjectMap& operator=(const ObjectMap&) = delete;
  ~ObjectMap();

  iterator begin() { return iterator(nodes_.begin()); }
  iterator end() { return iterator(nodes_.end()); }
  // Lookups take a key as std::string_view, absl::string_view or std::string.
  iterator find(absl::string_view key) { return iterator(nodes_.find(key)); }
  iterator find(std::string_view key) { return find(AsKey(key)); }
  iterator find(const std::string& key) { return find(AsKey(key)); }
  bool contains(absl::string_view key) const { return nodes_.contains(key); }
  bool contains(std::string_view key) const { return contains(AsKey(key)); }
  bool contains(const std::string& key) const { return contains(AsKey(key)); }
  void prefetch(std::string_view key) const { nodes_.prefetch(AsKey(key)); }
  // The hash the map files `key` under, and a find with it given (no second hashing).
  static size_t HashOf(std::string_view key) { return NodeHash()(AsKey(key)); }
  iterator find(std::string_view key, size_t hash) {
    return iterator(nodes_.find(AsKey(key), hash));
  }
  size_t size() const { return nodes_.size(); }

  // Bytes of one node for a key of `key_size` bytes (before the allocator's rounding).
  static constexpr size_t NodeBytes(size_t key_size) { return sizeof(Object) + key_size; }

 private:
  friend class ObjectTable;  // its Shard creates and erases nodes
  // Stores a node for `key` (absent) holding `fields`; returns it.
  Object& Emplace(std::string_view key, Object&& fields);
  // Removes and frees the node.
  void Erase(const Object* object);
  static void Free(Object* object);
  Set nodes_;
};

class ObjectTable {
 public:
  // The state of one shard, handed to callbacks with its lock held.
  struct Shard {
    absl::Mutex mu;
    ObjectMap objects ABSL_GUARDED_BY(mu);

    // --- The writes (the only ones): each changes one object of this shard. ---
    // Inserts a new object for `key` (absent) at the LRU front, with the fields set on
    // `fields` (a fresh Object: size, checksum, generation, state, writer, replicas).
    const Object& Insert(std::string_view key, Object&& fields) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    void Erase(ObjectMap::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { Erase(it.object()); }
    void Erase(const Object* object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    // Moves the object to the LRU front (most recently used).
    void Touch(const Object& object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    // A read: records its order (access_seq) and marks the object read (Object::lru_read)
    // without moving it in the LRU list; SecondChance moves it when a walk from the cold end
    // meets it. Relinking at every read cost two cache misses per key on the list neighbours at
    // fleet scale; a mark costs none (the node is in cache already).
    void MarkRead(const Object& object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    // CLOCK's second chance: moves a marked object (read since it was placed) to the LRU front
    // and clears its mark. Eviction and offload planning call it for each marked object their
    // walk from the cold end meets (read its lru_newer() first: the object moves), so the
    // objects they choose from were not read since they were placed.
    void SecondChance(const Object& object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    // Adds a replica: a memory replica before the first disk one, a disk replica last (lookups
    // hand out memory replicas first).
    void AddReplica(const Object& object, const StoredReplica& replica)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    // Removes the replicas for which pred(replica) is true (called once per replica, in order);
    // returns how many.
    template <typename Pred>
    size_t RemoveReplicas(const Object& object, Pred&& pred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      Object::Replicas& replicas = Mutable(object).replicas;
      const size_t before = replicas.size();
      replicas.erase(std::remove_if(replicas.begin(), replicas.end(), pred), replicas.end());
      return before - replicas.size();
    }
    // A put started (PENDING): when, and how many memory replicas it placed.
    void BeginPut(const Object& object, int64_t start_ms, uint32_t replicas_asked)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    // The put ended: COMPLETE with `checksum`, most recently used, its put marks gone (the
    // writer stays, so a repeated PutEnd is answered again).
    void CompletePut(const Object& object, uint64_t checksum) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    void StartPromotion(const Object& object, Object::Promotion promotion)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    // The memory placed for the promotion in progress (it has one).
    void PlacePromotion(const Object& object, const MemoryLocation& location)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    // The promotion in progress (it has one, placed) wrote its bytes: its memory becomes a
    // replica and the promotion ends.
    void CompletePromotion(const Object& object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    // Ends the promotion in progress, if any (its memory, if placed, is the caller's to free).
    void EndPromotion(const Object& object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    // Offload marks (Object::Transient): an OFFLOAD task queued at `now_ms`; a client could not
    // persist it at `now_ms` (which ends the queued task); both cleared (a disk replica arrived,
    // or the marks expired).
    void MarkOffloadQueued(const Object& object, int64_t now_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    void MarkOffloadFailed(const Object& object, int64_t now_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    void ClearOffloadMarks(const Object& object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    // Drops each offload mark set `timeout_ms` or longer before `now_ms`.
    void ExpireOffloadMarks(const Object& object, int64_t now_ms, int64_t timeout_ms)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    // Grants `lease` after dropping the object's expired ones (returns how many were dropped).
    size_t GrantLease(const Object& object, const Lease& lease, int64_t now_ms)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    // Ends lease `id` on the object this shard granted it next, if that object's key is `key`,
    // without loading the object (ShardLeases::ReleaseGranted); nullopt when the grant record
    // cannot tell: find the object and call ReleaseLease.
    std::optional<LeaseRelease> ReleaseGranted(uint64_t id, std::string_view key, uint64_t owner,
                                               int64_t now_ms, size_t* expired)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return leases_.ReleaseGranted(id, key, owner, now_ms, expired);
    }
    // Drops the object's expired leases (adds how many to *expired), then ends lease `id` if
    // `owner` holds it (ShardLeases::Release's answers).
    LeaseRelease ReleaseLease(const Object& object, uint64_t id, uint64_t owner, int64_t now_ms,
                              size_t* expired) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    // Drops every expired lease of the shard; returns how many leases expired.
    size_t SweepLeases(int64_t now_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

    // --- Reads. ---
    // The least and most recently used objects (null when the shard is empty); walk with
    // Object::lru_newer() / lru_older().
    const Object* LruOldest() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return lru_oldest_; }
    const Object* LruNewest() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return lru_newest_; }
    // The object's leases (expired ones the sweep has not seen included), and whether one is
    // live.
    const ShardLeases::Leases& LeasesOf(const Object& object) const
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      static const ShardLeases::Leases kNone;
      return object.maybe_leased ? leases_.Of(&object) : kNone;
    }
    bool HasLiveLease(const Object& object, int64_t now_ms) const
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return object.maybe_leased && leases_.HasLive(&object, now_ms);
    }
    // The objects with a lease entry (expired ones the sweep has not seen included), each with
    // its leases; an object leaves it when its last lease ends or when it is erased.
    const ShardLeases::ByObject& leased() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return leases_.objects();
    }
    // Grant records alive in this shard (ShardLeases).
    size_t LeaseGrantCount() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return leases_.GrantCount();
    }

    // Calls fn(i, it) for each i in `indices`, in order, with it = objects.find(keys[i]) (end()
    // when absent). A batch's keys land all over a table far larger than the caches, so their
    // cache misses are overlapped instead of taken one after another: the keys go kChunk at a
    // time; a chunk's keys are hashed and their table entries prefetched while fn runs for the
    // chunk before; then they are all found (each find loads its node to compare the key, a miss
    // that the next finds do not wait for; the rest of the node is prefetched), and only then
    // does fn run for them, meeting nodes in cache.
    // fn must not insert or erase objects (a found iterator of the chunk would go stale).
    template <typename Fn>
    void FindEach(const std::vector<std::string_view>& keys, const std::vector<size_t>& indices,
                  Fn&& fn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      const size_t n = indices.size();
      const ObjectMap::iterator absent = objects.end();
      size_t hashes[kFindChunk];
      ObjectMap::iterator found[kFindChunk];
      PrepareFinds(keys, indices, 0, hashes);
      for (size_t begin = 0; begin < n; begin += kFindChunk) {
        const size_t end = std::min(n, begin + kFindChunk);
        for (size_t j = begin; j < end; ++j) {
          found[j - begin] = objects.find(keys[indices[j]], hashes[j - begin]);
          if (found[j - begin] != absent) PrefetchNode(found[j - begin].object());
        }
        PrepareFinds(keys, indices, end, hashes);
        for (size_t j = begin; j < end; ++j) fn(indices[j], found[j - begin]);
      }
    }

   private:
    static constexpr size_t kFindChunk = 16;
    // Hashes the keys of indices[begin, begin + kFindChunk) into `hashes` and prefetches their
    // table entries.
    void PrepareFinds(const std::vector<std::string_view>& keys, const std::vector<size_t>& indices,
                      size_t begin, size_t* hashes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      const size_t end = std::min(indices.size(), begin + kFindChunk);
      for (size_t j = begin; j < end; ++j) {
        const std::string_view key = keys[indices[j]];
        hashes[j - begin] = ObjectMap::HashOf(key);
        objects.prefetch(key);
      }
    }
    // Prefetches the lines of a node that lookups and leases read (the key compare loaded the
    // key's).
    static void PrefetchNode(const Object* object) {
      __builtin_prefetch(object);
      __builtin_prefetch(reinterpret_cast<const char*>(object) + 64);
    }
    // The writable object behind a `const Object&` of this shard. Every node was created
    // non-const by ObjectMap::Emplace, so this is the one sanctioned way back to it.
    static Object& Mutable(const Object& object) { return const_cast<Object&>(object); }
    void Unlink(Object& object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    void PushFront(Object& object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

    ShardLeases leases_ ABSL_GUARDED_BY(mu);
    Object* lru_newest_ ABSL_GUARDED_BY(mu) = nullptr;
    Object* lru_oldest_ ABSL_GUARDED_BY(mu) = nullptr;
  };

  explicit ObjectTable(size_t shard_count = 32);

  // Calls fn(shard, indices) once per shard touched by `keys`, with that shard locked; `indices`
  // are positions in `keys`, ascending.
  void ForKeys(const std::vector<std::string_view>& keys,
               const std::function<void(Shard&, const std::vector<size_t>&)>& fn);
  // Calls fn(shard) for every shard in turn, each locked while fn runs.
  void ForEachShard(const std::function<void(Shard&)>& fn);
  Shard& ShardOf(std::string_view key);

  size_t shard_count() const { return shards_.size(); }

 private:
  size_t ShardIndex(std::string_view key) const;
  std::vector<std::unique_ptr<Shard>> shards_;
};

}  // namespace mc::master
