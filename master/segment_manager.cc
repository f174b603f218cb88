#include "master/segment_manager.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace mc::master {

uint64_t SegmentManager::AddSegment(const std::string& client_id, const std::string& endpoint,
                                    uint64_t size) {
  absl::MutexLock lock(&mu_);
  uint64_t id = next_segment_id_++;
  auto [it, inserted] =
      segments_.emplace(id, Segment{client_id, endpoint, OffsetAllocator(size, alignment_)});
  (void)inserted;
  const uint64_t free_bytes = it->second.allocator.free_bytes();
  capacity_ += it->second.allocator.capacity();
  ClientSpace& space = by_client_[client_id];
  clients_by_free_.erase({space.free_bytes, client_id});
  space.ids.push_back(id);
  space.free_bytes += free_bytes;
  space.by_free.emplace(free_bytes, id);
  clients_by_free_.emplace(space.free_bytes, client_id);
  return id;
}

size_t SegmentManager::RemoveClient(const std::string& client_id) {
  absl::MutexLock lock(&mu_);
  auto it = by_client_.find(client_id);
  if (it == by_client_.end()) return 0;
  size_t n = 0;
  for (uint64_t id : it->second.ids) {
    auto seg = segments_.find(id);
    if (seg == segments_.end()) continue;
    capacity_ -= seg->second.allocator.capacity();
    used_ -= seg->second.allocator.used();
    segments_.erase(seg);
    ++n;
  }
  clients_by_free_.erase({it->second.free_bytes, client_id});
  by_client_.erase(it);
  return n;
}

template <typename F>
auto SegmentManager::ChangeLocked(uint64_t id, Segment& seg, F change) {
  const uint64_t free_before = seg.allocator.free_bytes();
  const uint64_t used_before = seg.allocator.used();
  auto result = change(seg.allocator);
  const uint64_t free_after = seg.allocator.free_bytes();
  used_ = used_ - used_before + seg.allocator.used();
  if (free_after != free_before) {
    ClientSpace& space = by_client_.at(seg.client_id);
    space.by_free.erase({free_before, id});
    space.by_free.emplace(free_after, id);
    clients_by_free_.erase({space.free_bytes, seg.client_id});
    space.free_bytes = space.free_bytes - free_before + free_after;
    clients_by_free_.emplace(space.free_bytes, seg.client_id);
  }
  return result;
}

bool SegmentManager::AllocateOnClientLocked(const std::string& client_id, uint64_t size,
                                            MemoryLocation* out) {
  auto it = by_client_.find(client_id);
  if (it == by_client_.end() || it->second.free_bytes < size) return false;
  // Most free first; the first whose best fit succeeds. Segments with fewer free bytes than
  // `size` end the walk: none after them can fit.
  for (auto s = it->second.by_free.rbegin(); s != it->second.by_free.rend(); ++s) {
    if (s->first < size) break;
    const uint64_t id = s->second;
    Segment& seg = segments_.at(id);
    if (seg.allocator.largest_free() < size) continue;
    std::optional<uint64_t> offset =
        ChangeLocked(id, seg, [size](OffsetAllocator& a) { return a.Allocate(size); });
    if (!offset) continue;
    *out = MemoryLocation{client_id, seg.endpoint, id, *offset, size};
    return true;
  }
  return false;
}

absl::StatusOr<std::vector<MemoryLocation>> SegmentManager::Place(
    uint64_t size, uint32_t replicas, const std::string& preferred_client) {
  if (replicas == 0) replicas = 1;
  absl::MutexLock lock(&mu_);
  if (by_client_.size() < replicas) {
    return McError(Code::kNoSpace, absl::StrCat(replicas, " replicas asked, ", by_client_.size(),
                                                " clients have memory segments"));
  }
  std::vector<MemoryLocation> placed;
  MemoryLocation loc;
  if (!preferred_client.empty() && AllocateOnClientLocked(preferred_client, size, &loc)) {
    placed.push_back(std::move(loc));
  }
  // The others by free space, most first, straight from the index: a cursor walks down it (an
  // allocation moves its client lower, so the walk resumes below the cursor and skips clients
  // already holding a replica); a client with fewer free bytes than `size` ends it.
  std::pair<uint64_t, std::string> cursor{UINT64_MAX, std::string()};
  while (placed.size() < replicas) {
    auto c = clients_by_free_.lower_bound(cursor);
    if (c == clients_by_free_.begin()) break;
    --c;  // the largest entry below the cursor
    if (c->first < size) break;
    cursor = *c;
    if (cursor.second == preferred_client) continue;
    bool holds = false;
    for (const MemoryLocation& p : placed) holds |= p.client_id == cursor.second;
    if (holds) continue;
    if (AllocateOnClientLocked(cursor.second, size, &loc)) placed.push_back(std::move(loc));
  }
  if (placed.size() < replicas) {
    for (const auto& p : placed) {
      ChangeLocked(p.segment_id, segments_.at(p.segment_id),
                   [&p](OffsetAllocator& a) { return a.Free(p.offset); });
    }
    return McError(Code::kNoSpace, absl::StrCat("no room for ", replicas, " replica(s) of ", size,
                                                " bytes on distinct clients"));
  }
  return placed;
}

void SegmentManager::Free(const MemoryLocation& location) {
  absl::MutexLock lock(&mu_);
  auto it = segments_.find(location.segment_id);
  if (it == segments_.end()) return;
  ChangeLocked(location.segment_id, it->second,
               [&location](OffsetAllocator& a) { return a.Free(location.offset); });
}

absl::Status SegmentManager::CouldEverPlace(uint64_t size, uint32_t replicas) const {
  if (replicas == 0) replicas = 1;
  absl::MutexLock lock(&mu_);
  const uint64_t rounded = size > UINT64_MAX - alignment_
                               ? UINT64_MAX
                               : (size + alignment_ - 1) / alignment_ * alignment_;
  uint32_t able = 0;
  uint64_t largest = 0;
  for (const auto& [client, space] : by_client_) {
    uint64_t biggest = 0;
    for (uint64_t id : space.ids)
      biggest = std::max(biggest, segments_.at(id).allocator.capacity());
    largest = std::max(largest, biggest);
    if (biggest >= rounded) ++able;
  }
  if (able >= replicas) return absl::OkStatus();
  return McError(Code::kNoSpace,
                 absl::StrCat(replicas, " replica(s) of ", size,
                              " bytes need as many clients with a segment that large; ", able,
                              " of ", by_client_.size(), " client(s) have one (largest segment ",
                              largest, " bytes)"));
}

SegmentStats SegmentManager::Stats() const {
  absl::MutexLock lock(&mu_);
  return SegmentStats{capacity_, used_, segments_.size()};
}

SegmentStats SegmentManager::ClientStats(const std::string& client_id) const {
  absl::MutexLock lock(&mu_);
  SegmentStats stats;
  auto it = by_client_.find(client_id);
  if (it == by_client_.end()) return stats;
  for (uint64_t id : it->second.ids) {
    const Segment& seg = segments_.at(id);
    stats.capacity += seg.allocator.capacity();
    stats.used += seg.allocator.used();
    ++stats.segments;
  }
  return stats;
}

uint64_t SegmentManager::LargestFree() const {
  absl::MutexLock lock(&mu_);
  uint64_t largest = 0;
  for (const auto& [id, seg] : segments_) largest = std::max(largest, seg.allocator.largest_free());
  return largest;
}

}  // namespace mc::master
