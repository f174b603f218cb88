#include "client/session/object_index.h"

#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace mc::client {

ObjectIndex::ObjectIndex(std::vector<uint64_t> segment_sizes, Gauge* objects)
    : segment_sizes_(std::move(segment_sizes)), objects_(objects) {
  absl::MutexLock lock(&mu_);
  segments_.resize(segment_sizes_.size());
  UpdateGauge();
}

absl::Status ObjectIndex::Insert(size_t local_index, uint64_t offset, IndexedObject object) {
  if (local_index >= segment_sizes_.size()) {
    return McError(Code::kInvalidArgument, absl::StrCat("no local segment ", local_index));
  }
  const uint64_t size = object.size;
  const uint64_t limit = segment_sizes_[local_index];
  if (size == 0 || offset > limit || size > limit - offset) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("range ", offset, "+", size, " outside local segment ", local_index,
                                " of ", limit, " bytes"));
  }
  const uint64_t end = offset + size;
  absl::MutexLock lock(&mu_);
  std::map<uint64_t, IndexedObject>& seg = segments_[local_index];
  auto it = seg.lower_bound(offset);
  if (it != seg.begin()) {  // the entry starting before `offset` may reach into the range
    auto prev = std::prev(it);
    if (prev->first + prev->second.size > offset) {
      UnmapKey(prev->second.key, local_index, prev->first);
      seg.erase(prev);
      --count_;
    }
  }
  while (it != seg.end() && it->first < end) {
    UnmapKey(it->second.key, local_index, it->first);
    it = seg.erase(it);
    --count_;
  }
  by_key_.insert_or_assign(object.key, std::make_pair(local_index, offset));
  seg.emplace_hint(it, offset, std::move(object));
  ++count_;
  UpdateGauge();
  return absl::OkStatus();
}

bool ObjectIndex::Forget(size_t local_index, uint64_t offset) {
  if (local_index >= segment_sizes_.size()) return false;
  absl::MutexLock lock(&mu_);
  auto& seg = segments_[local_index];
  auto it = seg.find(offset);
  if (it == seg.end()) return false;
  UnmapKey(it->second.key, local_index, offset);
  seg.erase(it);
  --count_;
  UpdateGauge();
  return true;
}

bool ObjectIndex::Erase(size_t local_index, uint64_t offset, uint64_t generation) {
  if (local_index >= segment_sizes_.size()) return false;
  absl::MutexLock lock(&mu_);
  auto& seg = segments_[local_index];
  auto it = seg.find(offset);
  if (it == seg.end() || it->second.generation != generation) return false;
  UnmapKey(it->second.key, local_index, offset);
  seg.erase(it);
  --count_;
  UpdateGauge();
  return true;
}

std::vector<ObjectIndex::Entry> ObjectIndex::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<Entry> out;
  out.reserve(count_);
  for (size_t i = 0; i < segments_.size(); ++i) {
    for (const auto& [offset, object] : segments_[i]) out.push_back({i, offset, object});
  }
  return out;
}

std::optional<ObjectIndex::Entry> ObjectIndex::Find(std::string_view key) const {
  absl::MutexLock lock(&mu_);
  auto at = by_key_.find(absl::string_view(key.data(), key.size()));
  if (at == by_key_.end()) return std::nullopt;
  const auto [local_index, offset] = at->second;
  const auto& seg = segments_[local_index];
  auto it = seg.find(offset);
  if (it == seg.end()) return std::nullopt;  // not reached: every removal unmaps its key
  return Entry{local_index, offset, it->second};
}

void ObjectIndex::UnmapKey(const std::string& key, size_t local_index, uint64_t offset) {
  auto at = by_key_.find(key);
  if (at != by_key_.end() && at->second == std::make_pair(local_index, offset)) by_key_.erase(at);
}

size_t ObjectIndex::size() const {
  absl::MutexLock lock(&mu_);
  return count_;
}

void ObjectIndex::UpdateGauge() {
  if (objects_ != nullptr) objects_->Set(static_cast<int64_t>(count_));
}

}  // namespace mc::client
