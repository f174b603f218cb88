#include "master/segment_manager.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace mc::master {

SegmentManager::SegmentManager(const SegmentManagerOptions& options)
    : alignment_(options.alignment),
      epoch_bits_(static_cast<uint64_t>(options.epoch) << 32),
      forget_queue_limit_(options.forget_queue_limit),
      forget_dropped_(options.forget_dropped),
      next_counter_(options.first_segment_counter == 0 ? 1 : options.first_segment_counter) {}

uint64_t SegmentManager::AddSegmentLocked(const std::string& client_id, const std::string& endpoint,
                                          uint64_t size, bool held) {
  const uint64_t id = epoch_bits_ | next_counter_++;
  auto [it, inserted] =
      segments_.emplace(id, Segment{client_id, endpoint, OffsetAllocator(size, alignment_)});
  (void)inserted;
  const uint64_t free_bytes = it->second.allocator.free_bytes();
  capacity_ += it->second.allocator.capacity();
  ClientSpace& space = by_client_[client_id];
  if (!space.held) clients_by_free_.erase({space.free_bytes, client_id});
  if (held) space.held = true;
  space.ids.push_back(id);
  space.free_bytes += free_bytes;
  space.by_free.emplace(free_bytes, id);
  if (!space.held) clients_by_free_.emplace(space.free_bytes, client_id);
  return id;
}

uint64_t SegmentManager::AddSegment(const std::string& client_id, const std::string& endpoint,
                                    uint64_t size) {
  absl::MutexLock lock(&mu_);
  if (next_counter_ >= kSegmentCounterLimit) return 0;
  return AddSegmentLocked(client_id, endpoint, size, /*held=*/false);
}

absl::StatusOr<std::vector<uint64_t>> SegmentManager::AddClientSegments(
    const std::string& client_id, const std::string& endpoint, const std::vector<uint64_t>& sizes,
    bool held) {
  absl::MutexLock lock(&mu_);
  if (sizes.size() > kSegmentCounterLimit - next_counter_) {
    return McError(Code::kInternal,
                   absl::StrCat("this master run has assigned all its segment ids (",
                                next_counter_ - 1, "); restart the master to start a new epoch"));
  }
  std::vector<uint64_t> ids;
  ids.reserve(sizes.size());
  for (uint64_t size : sizes) ids.push_back(AddSegmentLocked(client_id, endpoint, size, held));
  return ids;
}

bool SegmentManager::Release(const std::string& client_id) {
  absl::MutexLock lock(&mu_);
  auto it = by_client_.find(client_id);
  if (it == by_client_.end() || !it->second.held) return false;
  it->second.held = false;
  clients_by_free_.emplace(it->second.free_bytes, client_id);
  return true;
}

bool SegmentManager::IsHeld(const std::string& client_id) const {
  absl::MutexLock lock(&mu_);
  auto it = by_client_.find(client_id);
  return it != by_client_.end() && it->second.held;
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
  if (!it->second.held) clients_by_free_.erase({it->second.free_bytes, client_id});
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
    if (!space.held) clients_by_free_.erase({space.free_bytes, seg.client_id});
    space.free_bytes = space.free_bytes - free_before + free_after;
    if (!space.held) clients_by_free_.emplace(space.free_bytes, seg.client_id);
  }
  return result;
}

bool SegmentManager::AllocateOnClientLocked(const std::string& client_id, uint64_t size,
                                            MemoryLocation* out) {
  auto it = by_client_.find(client_id);
  if (it == by_client_.end() || it->second.held || it->second.free_bytes < size) return false;
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
    uint64_t size, uint32_t replicas, const std::string& preferred_client,
    const std::vector<std::string>& avoid) {
  auto avoided = [&avoid](const std::string& client) {
    return std::find(avoid.begin(), avoid.end(), client) != avoid.end();
  };
  if (replicas == 0) replicas = 1;
  absl::MutexLock lock(&mu_);
  if (clients_by_free_.size() < replicas) {
    return McError(Code::kNoSpace,
                   absl::StrCat(replicas, " replicas asked, ", clients_by_free_.size(),
                                " clients have memory segments open to placement"));
  }
  std::vector<MemoryLocation> placed;
  MemoryLocation loc;
  if (!preferred_client.empty() && !avoided(preferred_client) &&
      AllocateOnClientLocked(preferred_client, size, &loc)) {
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
    if (cursor.second == preferred_client || avoided(cursor.second)) continue;
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
  const bool freed = ChangeLocked(location.segment_id, it->second, [&location](OffsetAllocator& a) {
    return a.Free(location.offset);
  });
  if (!freed || forget_queue_limit_ == 0) return;
  std::deque<ReplicaRef>& queue = by_client_.at(it->second.client_id).forgotten;
  if (queue.size() >= forget_queue_limit_) {
    queue.pop_front();
    if (forget_dropped_ != nullptr) forget_dropped_->Inc();
  }
  queue.push_back(ReplicaRef{location.segment_id, location.offset, location.generation});
}

std::vector<absl::Status> SegmentManager::AllocateAt(const std::string& client_id,
                                                     std::vector<MemoryLocation>& ranges) {
  std::vector<absl::Status> out(ranges.size());
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < ranges.size(); ++i) {
    MemoryLocation& r = ranges[i];
    auto it = segments_.find(r.segment_id);
    if (it == segments_.end() || it->second.client_id != client_id) {
      out[i] = McError(Code::kInvalidArgument,
                       absl::StrCat("segment ", r.segment_id, " is not one of client ", client_id,
                                    "'s current registration"));
      continue;
    }
    Segment& seg = it->second;
    const uint64_t offset = r.offset;
    const uint64_t length = r.length;
    if (!ChangeLocked(r.segment_id, seg,
                      [&](OffsetAllocator& a) { return a.AllocateAt(offset, length); })) {
      out[i] =
          McError(Code::kInvalidArgument,
                  absl::StrCat("range [", offset, ", +", length, ") of segment ", r.segment_id,
                               " is unaligned, outside the segment (", seg.allocator.capacity(),
                               " bytes) or overlaps another replica"));
      continue;
    }
    r.client_id = client_id;
    r.endpoint = seg.endpoint;
  }
  return out;
}

std::vector<ReplicaRef> SegmentManager::TakeForgotten(const std::string& client_id, size_t max,
                                                      bool* more) {
  std::vector<ReplicaRef> out;
  absl::MutexLock lock(&mu_);
  auto it = by_client_.find(client_id);
  if (it != by_client_.end()) {
    std::deque<ReplicaRef>& queue = it->second.forgotten;
    const size_t n = std::min(max, queue.size());
    out.assign(queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(n));
    queue.erase(queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(n));
  }
  if (more != nullptr) *more = it != by_client_.end() && !it->second.forgotten.empty();
  return out;
}

absl::Status SegmentManager::CouldEverPlace(uint64_t size, uint32_t replicas, bool* wait_for_held,
                                            const std::vector<std::string>& avoid) const {
  if (replicas == 0) replicas = 1;
  absl::MutexLock lock(&mu_);
  const uint64_t rounded = size > UINT64_MAX - alignment_
                               ? UINT64_MAX
                               : (size + alignment_ - 1) / alignment_ * alignment_;
  uint32_t able = 0;
  uint32_t able_held = 0;
  uint64_t largest = 0;
  for (const auto& [client, space] : by_client_) {
    if (std::find(avoid.begin(), avoid.end(), client) != avoid.end()) continue;
    uint64_t biggest = 0;
    for (uint64_t id : space.ids)
      biggest = std::max(biggest, segments_.at(id).allocator.capacity());
    largest = std::max(largest, biggest);
    if (biggest >= rounded) ++(space.held ? able_held : able);
  }
  if (able >= replicas) return absl::OkStatus();
  if (able + able_held >= replicas) {
    if (wait_for_held != nullptr) *wait_for_held = true;
    return McError(Code::kNoSpace,
                   absl::StrCat(replicas, " replica(s) of ", size, " bytes need ", replicas - able,
                                " more client(s) whose segments are held while they report "
                                "their objects (after a registration); retry shortly"));
  }
  return McError(
      Code::kNoSpace,
      absl::StrCat(replicas, " replica(s) of ", size,
                   " bytes need as many clients with a segment that large; ", able, " of ",
                   by_client_.size(), " client(s) have one (largest segment ", largest, " bytes)"));
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
