#include "master/object_table.h"

#include <algorithm>
#include <atomic>

#include "absl/hash/hash.h"

namespace mc::master {

namespace {
// Orders accesses across shards (millisecond timestamps tie under load).
std::atomic<uint64_t> g_access_seq{1};
}  // namespace

Object& ObjectTable::Shard::Insert(Object object) {
  object.access_seq = g_access_seq.fetch_add(1, std::memory_order_relaxed);
  std::string key = object.key;
  lru.push_front(key);
  object.lru_pos = lru.begin();
  auto [it, inserted] = objects.emplace(std::move(key), std::move(object));
  (void)inserted;
  return it->second;
}

void ObjectTable::Shard::Erase(absl::flat_hash_map<std::string, Object>::iterator it) {
  lru.erase(it->second.lru_pos);
  leased.erase(it->first);
  objects.erase(it);
}

void ObjectTable::Shard::Touch(Object& object, int64_t now_ms) {
  object.last_access_ms = now_ms;
  object.access_seq = g_access_seq.fetch_add(1, std::memory_order_relaxed);
  lru.splice(lru.begin(), lru, object.lru_pos);
}

ObjectTable::ObjectTable(size_t shard_count) {
  if (shard_count == 0) shard_count = 1;
  shards_.reserve(shard_count);
  for (size_t i = 0; i < shard_count; ++i) shards_.push_back(std::make_unique<Shard>());
}

size_t ObjectTable::ShardIndex(std::string_view key) const {
  return absl::HashOf(absl::string_view(key.data(), key.size())) % shards_.size();
}

ObjectTable::Shard& ObjectTable::ShardOf(std::string_view key) { return *shards_[ShardIndex(key)]; }

void ObjectTable::ForKeys(const std::vector<std::string_view>& keys,
                          const std::function<void(Shard&, const std::vector<size_t>&)>& fn) {
  // (shard, position) pairs sorted by shard: one allocation, each shard locked once.
  std::vector<std::pair<uint32_t, uint32_t>> order(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    order[i] = {static_cast<uint32_t>(ShardIndex(keys[i])), static_cast<uint32_t>(i)};
  }
  std::sort(order.begin(), order.end());
  std::vector<size_t> indices;
  indices.reserve(keys.size());
  for (size_t begin = 0; begin < order.size();) {
    size_t end = begin;
    indices.clear();
    while (end < order.size() && order[end].first == order[begin].first) {
      indices.push_back(order[end++].second);
    }
    Shard& shard = *shards_[order[begin].first];
    absl::MutexLock lock(&shard.mu);
    fn(shard, indices);
    begin = end;
  }
}

void ObjectTable::ForEachShard(const std::function<void(Shard&)>& fn) {
  for (auto& shard : shards_) {
    absl::MutexLock lock(&shard->mu);
    fn(*shard);
  }
}

}  // namespace mc::master
