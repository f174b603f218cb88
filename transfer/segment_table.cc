#include "transfer/segment_table.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace mc::transfer {

void SegmentTable::Add(uint64_t segment_id, char* base, uint64_t size) {
  absl::MutexLock lock(&mu_);
  segments_[segment_id] = Segment{base, size};
}

void SegmentTable::Remove(uint64_t segment_id) {
  absl::MutexLock lock(&mu_);
  segments_.erase(segment_id);
}

void SegmentTable::Clear() {
  absl::MutexLock lock(&mu_);
  segments_.clear();
}

std::vector<SegmentTable::Entry> SegmentTable::List() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<Entry> out;
  out.reserve(segments_.size());
  for (const auto& [id, seg] : segments_) out.push_back({id, seg.base, seg.size});
  return out;
}

absl::StatusOr<char*> SegmentTable::Resolve(uint64_t segment_id, uint64_t offset,
                                            uint64_t length) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = segments_.find(segment_id);
  if (it == segments_.end()) {
    return McError(Code::kNotFound, absl::StrCat("unknown segment ", segment_id));
  }
  const Segment& seg = it->second;
  // Overflow-safe form of offset + length <= size.
  if (offset > seg.size || length > seg.size - offset) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("range [", offset, ", +", length, ") outside segment ",
                                segment_id, " of ", seg.size, " bytes"));
  }
  return seg.base + offset;
}

}  // namespace mc::transfer
