#include "master/offset_allocator.h"

namespace mc::master {

OffsetAllocator::OffsetAllocator(uint64_t capacity, uint64_t alignment)
    : capacity_(capacity - capacity % (alignment == 0 ? 1 : alignment)),
      alignment_(alignment == 0 ? 1 : alignment) {
  if (capacity_ > 0) InsertFree(0, capacity_);
}

void OffsetAllocator::InsertFree(uint64_t offset, uint64_t size) {
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
}

void OffsetAllocator::EraseFree(absl::btree_map<uint64_t, uint64_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

std::optional<uint64_t> OffsetAllocator::Allocate(uint64_t size) {
  if (size == 0 || size > capacity_) return std::nullopt;
  uint64_t rounded = (size + alignment_ - 1) / alignment_ * alignment_;
  auto best = free_by_size_.lower_bound({rounded, 0});
  if (best == free_by_size_.end()) return std::nullopt;
  auto [free_size, offset] = *best;
  EraseFree(free_by_offset_.find(offset));
  if (free_size > rounded) InsertFree(offset + rounded, free_size - rounded);
  allocated_.emplace(offset, rounded);
  used_ += rounded;
  return offset;
}

bool OffsetAllocator::AllocateAt(uint64_t offset, uint64_t size) {
  if (size == 0 || size > capacity_ || offset % alignment_ != 0 || offset > capacity_ - size) {
    return false;
  }
  const uint64_t rounded = (size + alignment_ - 1) / alignment_ * alignment_;
  if (offset > capacity_ - rounded) return false;  // capacity_ is aligned: cannot happen
  // The free range that starts at or before `offset` must cover the whole request.
  auto it = free_by_offset_.upper_bound(offset);
  if (it == free_by_offset_.begin()) return false;
  --it;
  const auto [free_offset, free_size] = *it;
  if (free_offset + free_size < offset + rounded) return false;
  EraseFree(it);
  if (offset > free_offset) InsertFree(free_offset, offset - free_offset);
  const uint64_t end = offset + rounded;
  if (free_offset + free_size > end) InsertFree(end, free_offset + free_size - end);
  allocated_.emplace(offset, rounded);
  used_ += rounded;
  return true;
}

bool OffsetAllocator::Free(uint64_t offset) {
  auto it = allocated_.find(offset);
  if (it == allocated_.end()) return false;
  uint64_t size = it->second;
  allocated_.erase(it);
  used_ -= size;
  // Coalesce with the free neighbour after, then the one before.
  auto next = free_by_offset_.find(offset + size);
  if (next != free_by_offset_.end()) {
    size += next->second;
    EraseFree(next);
  }
  auto after = free_by_offset_.lower_bound(offset);
  if (after != free_by_offset_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      size += prev->second;
      EraseFree(prev);
    }
  }
  InsertFree(offset, size);
  return true;
}

uint64_t OffsetAllocator::largest_free() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

uint64_t OffsetAllocator::AllocatedSize(uint64_t offset) const {
  auto it = allocated_.find(offset);
  return it == allocated_.end() ? 0 : it->second;
}

}  // namespace mc::master
