#include "offload/internal/record_index.h"

namespace mc::offload::internal {

void RecordIndex::Account(const Slot& s, int sign) {
  if (!Evictable(s)) return;
  if (sign > 0) {
    evictable_bytes_ += s.extent.length;
  } else {
    evictable_bytes_ -= s.extent.length;
  }
}

Slot* RecordIndex::Find(std::string_view key, uint64_t generation) {
  auto it = slots_.find(MakeKey(key, generation));
  return it == slots_.end() ? nullptr : &it->second;
}

Slot* RecordIndex::InsertWriting(std::string_view key, uint64_t generation) {
  auto [it, inserted] = slots_.try_emplace(MakeKey(key, generation));
  return inserted ? &it->second : nullptr;
}

void RecordIndex::MarkReady(std::string_view key, uint64_t generation, const Extent& extent,
                            uint64_t payload_len, uint64_t checksum) {
  Key k = MakeKey(key, generation);
  Slot& s = slots_[k];
  if (s.ready) return;
  s.ready = true;
  s.extent = extent;
  s.payload_len = payload_len;
  s.checksum = checksum;
  s.lru_tick = next_tick_++;
  lru_.emplace(s.lru_tick, std::move(k));
  Account(s, +1);
}

void RecordIndex::Touch(std::string_view key, uint64_t generation) {
  Slot* s = Find(key, generation);
  if (s == nullptr || !s->ready) return;
  auto node = lru_.extract(s->lru_tick);
  s->lru_tick = next_tick_++;
  node.key() = s->lru_tick;
  lru_.insert(std::move(node));
}

void RecordIndex::Pin(std::string_view key, uint64_t generation) {
  Slot* s = Find(key, generation);
  if (s == nullptr) return;
  Account(*s, -1);
  ++s->pins;
}

void RecordIndex::Unpin(std::string_view key, uint64_t generation) {
  Slot* s = Find(key, generation);
  if (s == nullptr || s->pins == 0) return;
  --s->pins;
  Account(*s, +1);
}

bool RecordIndex::Erase(std::string_view key, uint64_t generation) {
  auto it = slots_.find(MakeKey(key, generation));
  if (it == slots_.end()) return false;
  Account(it->second, -1);
  if (it->second.ready) lru_.erase(it->second.lru_tick);
  slots_.erase(it);
  return true;
}

std::vector<IndexedRecord> RecordIndex::TakeVictims(uint64_t bytes) {
  std::vector<IndexedRecord> victims;
  uint64_t covered = 0;
  for (auto it = lru_.begin(); it != lru_.end() && covered < bytes;) {
    auto slot_it = slots_.find(it->second);
    Slot& s = slot_it->second;
    if (!Evictable(s)) {
      ++it;
      continue;
    }
    covered += s.extent.length;
    Account(s, -1);
    victims.push_back(IndexedRecord{it->second.first, it->second.second, s.extent, s.payload_len, s.checksum});
    slots_.erase(slot_it);
    it = lru_.erase(it);
  }
  return victims;
}

std::vector<IndexedRecord> RecordIndex::PeekVictims(uint64_t bytes) const {
  std::vector<IndexedRecord> victims;
  uint64_t covered = 0;
  for (auto it = lru_.begin(); it != lru_.end() && covered < bytes; ++it) {
    const Slot& s = slots_.at(it->second);
    if (!Evictable(s)) continue;
    covered += s.extent.length;
    victims.push_back(
        IndexedRecord{it->second.first, it->second.second, s.extent, s.payload_len, s.checksum});
  }
  return victims;
}

std::vector<IndexedRecord> RecordIndex::ListReady() const {
  std::vector<IndexedRecord> out;
  out.reserve(lru_.size());
  for (const auto& [tick, k] : lru_) {
    const Slot& s = slots_.at(k);
    out.push_back(IndexedRecord{k.first, k.second, s.extent, s.payload_len, s.checksum});
  }
  return out;
}

}  // namespace mc::offload::internal
