#include "master/segment_manager.h"

#include <algorithm>

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
  capacity_ += it->second.allocator.capacity();
  by_client_[client_id].push_back(id);
  return id;
}

size_t SegmentManager::RemoveClient(const std::string& client_id) {
  absl::MutexLock lock(&mu_);
  auto it = by_client_.find(client_id);
  if (it == by_client_.end()) return 0;
  size_t n = 0;
  for (uint64_t id : it->second) {
    auto seg = segments_.find(id);
    if (seg == segments_.end()) continue;
    capacity_ -= seg->second.allocator.capacity();
    used_ -= seg->second.allocator.used();
    segments_.erase(seg);
    ++n;
  }
  by_client_.erase(it);
  return n;
}

bool SegmentManager::AllocateOnClientLocked(const std::string& client_id, uint64_t size,
                                            MemoryLocation* out) {
  auto it = by_client_.find(client_id);
  if (it == by_client_.end()) return false;
  Segment* best = nullptr;
  uint64_t best_id = 0;
  for (uint64_t id : it->second) {
    Segment& seg = segments_.at(id);
    if (seg.allocator.largest_free() < size) continue;
    if (best == nullptr || seg.allocator.free_bytes() > best->allocator.free_bytes()) {
      best = &seg;
      best_id = id;
    }
  }
  if (best == nullptr) return false;
  uint64_t before = best->allocator.used();
  auto offset = best->allocator.Allocate(size);
  if (!offset) return false;
  used_ += best->allocator.used() - before;
  *out = MemoryLocation{client_id, best->endpoint, best_id, *offset, size};
  return true;
}

absl::StatusOr<std::vector<MemoryLocation>> SegmentManager::Place(
    uint64_t size, uint32_t replicas, const std::string& preferred_client) {
  if (replicas == 0) replicas = 1;
  absl::MutexLock lock(&mu_);
  if (by_client_.size() < replicas) {
    return McError(Code::kNoSpace, absl::StrCat(replicas, " replicas asked, ", by_client_.size(),
                                                " clients have memory segments"));
  }
  // Candidate clients: the preferred one first, then by free space, most first.
  std::vector<std::pair<uint64_t, const std::string*>> order;
  for (const auto& [client, ids] : by_client_) {
    if (client == preferred_client) continue;
    uint64_t free_bytes = 0;
    for (uint64_t id : ids) free_bytes += segments_.at(id).allocator.free_bytes();
    order.emplace_back(free_bytes, &client);
  }
  std::sort(order.begin(), order.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<MemoryLocation> placed;
  MemoryLocation loc;
  if (!preferred_client.empty() && AllocateOnClientLocked(preferred_client, size, &loc)) {
    placed.push_back(std::move(loc));
  }
  for (size_t i = 0; i < order.size() && placed.size() < replicas; ++i) {
    if (AllocateOnClientLocked(*order[i].second, size, &loc)) placed.push_back(std::move(loc));
  }
  if (placed.size() < replicas) {
    for (const auto& p : placed) {
      Segment& seg = segments_.at(p.segment_id);
      uint64_t before = seg.allocator.used();
      seg.allocator.Free(p.offset);
      used_ -= before - seg.allocator.used();
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
  uint64_t before = it->second.allocator.used();
  it->second.allocator.Free(location.offset);
  used_ -= before - it->second.allocator.used();
}

absl::Status SegmentManager::CouldEverPlace(uint64_t size, uint32_t replicas) const {
  if (replicas == 0) replicas = 1;
  absl::MutexLock lock(&mu_);
  const uint64_t rounded = size > UINT64_MAX - alignment_
                               ? UINT64_MAX
                               : (size + alignment_ - 1) / alignment_ * alignment_;
  uint32_t able = 0;
  uint64_t largest = 0;
  for (const auto& [client, ids] : by_client_) {
    uint64_t biggest = 0;
    for (uint64_t id : ids) biggest = std::max(biggest, segments_.at(id).allocator.capacity());
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
  for (uint64_t id : it->second) {
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
