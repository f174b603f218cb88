#include "master/object_table.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>

#include "absl/hash/hash.h"
#include "common/status_macros.h"

namespace mc::master {

namespace {
// Orders accesses across shards (millisecond timestamps tie under load).
std::atomic<uint64_t> g_access_seq{1};
}  // namespace

ObjectMap::~ObjectMap() {
  for (Object* object : nodes_) Free(object);
}

Object& ObjectMap::Emplace(std::string_view key, Object&& fields) {
  MC_CHECK(key.size() <= UINT32_MAX);
  void* memory = ::operator new(NodeBytes(key.size()));
  Object* object = new (memory) Object(std::move(fields));
  object->key_size_ = static_cast<uint32_t>(key.size());
  if (!key.empty()) std::memcpy(reinterpret_cast<char*>(object + 1), key.data(), key.size());
  nodes_.insert(object);
  return *object;
}

void ObjectMap::Erase(const Object* object) {
  // The node was allocated non-const by Emplace.
  Object* node = const_cast<Object*>(object);
  nodes_.erase(node);
  Free(node);
}

void ObjectMap::Free(Object* object) {
  object->~Object();
  ::operator delete(static_cast<void*>(object));
}

const Object& ObjectTable::Shard::Insert(std::string_view key, Object&& fields) {
  fields.access_seq = g_access_seq.fetch_add(1, std::memory_order_relaxed);
  Object& object = objects.Emplace(key, std::move(fields));
  PushFront(object);
  return object;
}

void ObjectTable::Shard::Erase(const Object* object) {
  Object& node = Mutable(*object);
  Unlink(node);
  if (node.maybe_leased) leases_.Forget(&node);
  objects.Erase(object);
}

void ObjectTable::Shard::Touch(const Object& object) {
  Object& node = Mutable(object);
  node.access_seq = g_access_seq.fetch_add(1, std::memory_order_relaxed);
  node.lru_read = false;
  if (lru_newest_ == &node) return;
  Unlink(node);
  PushFront(node);
}

void ObjectTable::Shard::MarkRead(const Object& object) {
  Object& node = Mutable(object);
  node.access_seq = g_access_seq.fetch_add(1, std::memory_order_relaxed);
  if (lru_newest_ != &node) node.lru_read = true;
}

void ObjectTable::Shard::SecondChance(const Object& object) {
  Object& node = Mutable(object);
  node.lru_read = false;
  if (lru_newest_ == &node) return;
  Unlink(node);
  PushFront(node);
}

void ObjectTable::Shard::AddReplica(const Object& object, const StoredReplica& replica) {
  Object::Replicas& replicas = Mutable(object).replicas;
  auto at = replicas.end();
  if (replica.tier == ReplicaTier::kMemory) {
    at = std::find_if(replicas.begin(), replicas.end(),
                      [](const StoredReplica& r) { return r.tier == ReplicaTier::kDisk; });
  }
  replicas.insert(at, replica);
}

void ObjectTable::Shard::BeginPut(const Object& object, int64_t start_ms, uint32_t replicas_asked) {
  Object::Transient& put = Mutable(object).MutableTransient();
  put.put_start_ms = start_ms;
  put.replicas_asked = replicas_asked;
}

void ObjectTable::Shard::CompletePut(const Object& object, uint64_t checksum) {
  Object& node = Mutable(object);
  node.state = ObjectState::kComplete;
  node.checksum = checksum;
  Touch(node);
  if (node.transient_) {
    node.transient_->put_start_ms = 0;
    node.transient_->replicas_asked = 0;
    node.TrimTransient();
  }
}

void ObjectTable::Shard::StartPromotion(const Object& object, Object::Promotion promotion) {
  Mutable(object).StartPromotion(std::move(promotion));
}

void ObjectTable::Shard::PlacePromotion(const Object& object, const MemoryLocation& location) {
  Object& node = Mutable(object);
  MC_CHECK(node.transient_ && node.transient_->promotion);
  node.transient_->promotion->location = location;
}

void ObjectTable::Shard::CompletePromotion(const Object& object) {
  const Object::Promotion* promotion = object.promotion();
  MC_CHECK(promotion != nullptr && promotion->location.length > 0);
  AddReplica(object, StoredReplica::Of(ReplicaTier::kMemory, promotion->location));
  EndPromotion(object);
}

void ObjectTable::Shard::EndPromotion(const Object& object) { Mutable(object).EndPromotion(); }

void ObjectTable::Shard::MarkOffloadQueued(const Object& object, int64_t now_ms) {
  Mutable(object).MutableTransient().offload_queued_ms = now_ms;
}

void ObjectTable::Shard::MarkOffloadFailed(const Object& object, int64_t now_ms) {
  Object::Transient& offload = Mutable(object).MutableTransient();
  offload.offload_failed_ms = now_ms;
  offload.offload_queued_ms = 0;  // the task queued for it, if any, is over
}

void ObjectTable::Shard::ClearOffloadMarks(const Object& object) {
  Object& node = Mutable(object);
  if (!node.transient_) return;
  node.transient_->offload_queued_ms = 0;
  node.transient_->offload_failed_ms = 0;
  node.TrimTransient();
}

void ObjectTable::Shard::ExpireOffloadMarks(const Object& object, int64_t now_ms,
                                            int64_t timeout_ms) {
  Object& node = Mutable(object);
  if (!node.transient_) return;
  Object::Transient& t = *node.transient_;
  if (t.offload_queued_ms != 0 && now_ms - t.offload_queued_ms >= timeout_ms) {
    t.offload_queued_ms = 0;
  }
  if (t.offload_failed_ms != 0 && now_ms - t.offload_failed_ms >= timeout_ms) {
    t.offload_failed_ms = 0;
  }
  node.TrimTransient();
}

size_t ObjectTable::Shard::GrantLease(const Object& object, const Lease& lease, int64_t now_ms) {
  Object& node = Mutable(object);
  node.maybe_leased = true;
  return leases_.Grant(&node, node.key(), lease, now_ms);
}

LeaseRelease ObjectTable::Shard::ReleaseLease(const Object& object, uint64_t id, uint64_t owner,
                                              int64_t now_ms, size_t* expired) {
  if (!object.maybe_leased) return LeaseRelease::kNotHeld;
  const LeaseRelease outcome = leases_.Release(&object, id, owner, now_ms, expired);
  // The node is in cache here: clear the mark once the last lease is gone.
  if (!leases_.Holds(&object)) Mutable(object).maybe_leased = false;
  return outcome;
}

size_t ObjectTable::Shard::SweepLeases(int64_t now_ms) {
  return leases_.Sweep(now_ms, [](const Object* object) { Mutable(*object).maybe_leased = false; });
}

void ObjectTable::Shard::Unlink(Object& object) {
  Object* newer = object.lru_newer_;
  Object* older = object.lru_older_;
  if (newer != nullptr) {
    newer->lru_older_ = older;
  } else {
    lru_newest_ = older;
  }
  if (older != nullptr) {
    older->lru_newer_ = newer;
  } else {
    lru_oldest_ = newer;
  }
  object.lru_newer_ = nullptr;
  object.lru_older_ = nullptr;
}

void ObjectTable::Shard::PushFront(Object& object) {
  object.lru_newer_ = nullptr;
  object.lru_older_ = lru_newest_;
  if (lru_newest_ != nullptr) {
    lru_newest_->lru_newer_ = &object;
  } else {
    lru_oldest_ = &object;
  }
  lru_newest_ = &object;
}

ObjectTable::ObjectTable(size_t shard_count) {
  if (shard_count == 0) shard_count = 1;
  shards_.reserve(shard_count);
  for (size_t i = 0; i < shard_count; ++i) shards_.push_back(std::make_unique<Shard>());
}

size_t ObjectTable::ShardIndex(std::string_view key) const {
  // From the hash's top 32 bits (multiply-shift): a shard's map hashes the key with the same
  // function and takes its control byte from the low 7 bits and its probe position from the bits
  // above them. A shard index of `hash % 32` fixed the low 5 bits of every key of a shard, so its
  // keys shared 4 control bytes instead of 128 and each probe compared the key of ~1 in 4 nodes of
  // its group (a cache miss per node at fleet scale) instead of ~1 in 128.
  const uint64_t hash = absl::HashOf(absl::string_view(key.data(), key.size()));
  return static_cast<size_t>(((hash >> 32) * shards_.size()) >> 32);
}

ObjectTable::Shard& ObjectTable::ShardOf(std::string_view key) { return *shards_[ShardIndex(key)]; }

void ObjectTable::ForKeys(const std::vector<std::string_view>& keys,
                          const std::function<void(Shard&, const std::vector<size_t>&)>& fn) {
  if (keys.size() == 1) {  // the common single-key call: no grouping at all
    static const std::vector<size_t> kOnlyKey{0};
    Shard& shard = *shards_[ShardIndex(keys[0])];
    absl::MutexLock lock(&shard.mu);
    fn(shard, kOnlyKey);
    return;
  }
  // Positions grouped by shard with a counting sort (ascending within a shard): each shard is
  // locked once, and the grouping costs O(keys + shards).
  std::vector<uint32_t> shard_of(keys.size());
  std::vector<size_t> start(shards_.size() + 1, 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    shard_of[i] = static_cast<uint32_t>(ShardIndex(keys[i]));
    ++start[shard_of[i] + 1];
  }
  for (size_t s = 0; s < shards_.size(); ++s) start[s + 1] += start[s];
  std::vector<size_t> order(keys.size());
  std::vector<size_t> next(start.begin(), start.end() - 1);
  for (size_t i = 0; i < keys.size(); ++i) order[next[shard_of[i]]++] = i;
  std::vector<size_t> indices;
  indices.reserve(keys.size());
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (start[s] == start[s + 1]) continue;
    indices.assign(order.begin() + static_cast<std::ptrdiff_t>(start[s]),
                   order.begin() + static_cast<std::ptrdiff_t>(start[s + 1]));
    Shard& shard = *shards_[s];
    absl::MutexLock lock(&shard.mu);
    fn(shard, indices);
  }
}

void ObjectTable::ForEachShard(const std::function<void(Shard&)>& fn) {
  for (auto& shard : shards_) {
    absl::MutexLock lock(&shard->mu);
    fn(*shard);
  }
}

}  // namespace mc::master
