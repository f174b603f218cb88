// ObjectTable: every object the master knows, sharded by key hash.
//
// Each shard has its own mutex, map and LRU list (most recently used at the front). Batched
// calls group their keys by shard and take each shard's lock once per batch (ForKeys); scans
// (eviction, liveness, lease sweeps) visit one shard at a time and never hold two shard locks.
// Lock order: a shard lock may be held while taking SegmentManager's lock, never the reverse.
// Thread-safe.
//
// Memory (issue 16): an object is one heap node, an Object followed by its key's bytes (the key
// is stored once); a shard's map is a flat set of pointers to the nodes, found by key, and its
// LRU list is intrusive (the links are in the Object). See object.h for the Object's layout.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/synchronization/mutex.h"
#include "master/object.h"

namespace mc::master {

// A key for heterogeneous lookups in the table's maps (no temporary std::string).
inline absl::string_view AsKey(std::string_view key) { return {key.data(), key.size()}; }

// One shard's objects by key: owns the nodes (Object + key bytes). Map-like: find() answers an
// iterator whose `->first` is the key and `->second` the Object. Not thread-safe (its shard's
// lock guards it).
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
    Object& second;
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
    Object* object() const { return *it_; }
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
  size_t size() const { return nodes_.size(); }

  // Stores a node for `key` (absent) holding `fields`; returns it.
  Object& Emplace(std::string_view key, Object&& fields);
  // Removes and frees the node.
  void Erase(Object* object);

  // Bytes of one node for a key of `key_size` bytes (before the allocator's rounding).
  static constexpr size_t NodeBytes(size_t key_size) { return sizeof(Object) + key_size; }

 private:
  static void Free(Object* object);
  Set nodes_;
};

class ObjectTable {
 public:
  // The state of one shard, handed to callbacks with its lock held.
  struct Shard {
    absl::Mutex mu;
    ObjectMap objects ABSL_GUARDED_BY(mu);
    // Objects that hold or recently held leases (a superset of the leased objects: releases
    // leave them here and the lease sweep drops those without live leases). An object leaves it
    // when erased.
    absl::flat_hash_set<Object*> leased ABSL_GUARDED_BY(mu);

    // Inserts a new object for `key` (absent) at the LRU front.
    Object& Insert(std::string_view key, Object fields) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    void Erase(ObjectMap::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { Erase(it.object()); }
    void Erase(Object* object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    // Moves the object to the LRU front (most recently used).
    void Touch(Object& object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    // The least and most recently used objects (null when the shard is empty); walk with
    // Object::lru_newer() / lru_older().
    Object* LruOldest() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return lru_oldest_; }
    Object* LruNewest() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return lru_newest_; }
    // Adds the object to `leased` once (Object::lease_indexed).
    void IndexLease(Object& object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

    // Calls fn(i, it) for each i in `indices`, in order, with it = objects.find(keys[i]) (end()
    // when absent), while prefetching the table entries of the keys a few positions ahead: a
    // batch's keys land all over a table far larger than the caches, and overlapping their
    // cache misses instead of taking them one after another saved 10-20% per key.
    template <typename Fn>
    void FindEach(const std::vector<std::string_view>& keys, const std::vector<size_t>& indices,
                  Fn&& fn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      constexpr size_t kAhead = 4;
      const size_t n = indices.size();
      for (size_t j = 0; j < n && j < kAhead; ++j) objects.prefetch(keys[indices[j]]);
      for (size_t j = 0; j < n; ++j) {
        if (j + kAhead < n) objects.prefetch(keys[indices[j + kAhead]]);
        const size_t i = indices[j];
        fn(i, objects.find(keys[i]));
      }
    }

   private:
    void Unlink(Object& object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    void PushFront(Object& object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

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
