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
