#include "offload/extent_allocator.h"

#include <iterator>

#include "absl/strings/str_format.h"
#include "common/status.h"

namespace mc::offload {

ExtentAllocator::ExtentAllocator(const std::vector<uint64_t>& file_sizes) {
  for (uint64_t size : file_sizes) {
    uint64_t usable = RoundDownToPage(size);
    file_sizes_.push_back(usable);
    capacity_ += usable;
    if (usable > 0) InsertFree(static_cast<uint32_t>(file_sizes_.size() - 1), 0, usable);
  }
}

void ExtentAllocator::InsertFree(uint32_t file, uint64_t offset, uint64_t length) {
  by_pos_.emplace(Pos{file, offset}, length);
  by_size_.emplace(length, file, offset);
  free_bytes_ += length;
}

void ExtentAllocator::EraseFree(std::map<Pos, uint64_t>::iterator it) {
  by_size_.erase(SizeKey{it->second, it->first.first, it->first.second});
  free_bytes_ -= it->second;
  by_pos_.erase(it);
}

std::optional<Extent> ExtentAllocator::Allocate(uint64_t length) {
  if (length == 0 || length > capacity_) return std::nullopt;
  const uint64_t want = RoundUpToPage(length);
  auto fit = by_size_.lower_bound(SizeKey{want, 0, 0});
  if (fit == by_size_.end()) return std::nullopt;
  auto [len, file, offset] = *fit;
  EraseFree(by_pos_.find(Pos{file, offset}));
  if (len > want) InsertFree(file, offset + want, len - want);
  return Extent{file, offset, want};
}

bool ExtentAllocator::ValidShape(const Extent& e) const {
  return e.file < file_sizes_.size() && e.length > 0 && e.offset % kPageSize == 0 &&
         e.length % kPageSize == 0 && e.offset <= file_sizes_[e.file] &&
         e.length <= file_sizes_[e.file] - e.offset;
}

absl::Status ExtentAllocator::Free(const Extent& e) {
  if (!ValidShape(e)) {
    return McError(Code::kInvalidArgument,
                   absl::StrFormat("free of invalid extent file=%u offset=%u length=%u", e.file,
                                   e.offset, e.length));
  }
  // The free neighbours: the first free extent at or after e, and the one before it.
  auto next = by_pos_.lower_bound(Pos{e.file, e.offset});
  auto prev = next == by_pos_.begin() ? by_pos_.end() : std::prev(next);
  const uint64_t end = e.offset + e.length;
  if (next != by_pos_.end() && next->first.first == e.file && next->first.second < end) {
    return McError(Code::kInvalidArgument, "free overlaps free space (double free)");
  }
  bool merge_prev = prev != by_pos_.end() && prev->first.first == e.file;
  if (merge_prev && prev->first.second + prev->second > e.offset) {
    return McError(Code::kInvalidArgument, "free overlaps free space (double free)");
  }
  merge_prev = merge_prev && prev->first.second + prev->second == e.offset;
  const bool merge_next =
      next != by_pos_.end() && next->first.first == e.file && next->first.second == end;
  uint64_t start = e.offset;
  uint64_t length = e.length;
  if (merge_prev) {
    start = prev->first.second;
    length += prev->second;
    EraseFree(prev);
  }
  if (merge_next) {
    length += next->second;
    EraseFree(next);
  }
  InsertFree(e.file, start, length);
  return absl::OkStatus();
}

absl::Status ExtentAllocator::MarkUsed(const Extent& e) {
  if (!ValidShape(e)) return McError(Code::kInvalidArgument, "mark of invalid extent");
  // The free extent containing e.offset starts at or before it.
  auto it = by_pos_.upper_bound(Pos{e.file, e.offset});
  if (it == by_pos_.begin()) return McError(Code::kInvalidArgument, "extent is not free");
  --it;
  const auto [file, start] = it->first;
  const uint64_t len = it->second;
  if (file != e.file || start + len < e.offset + e.length) {
    return McError(Code::kInvalidArgument, "extent is not free");
  }
  EraseFree(it);
  if (e.offset > start) InsertFree(file, start, e.offset - start);
  const uint64_t end = e.offset + e.length;
  if (start + len > end) InsertFree(file, end, start + len - end);
  return absl::OkStatus();
}

uint64_t ExtentAllocator::largest_free() const {
  return by_size_.empty() ? 0 : std::get<0>(*by_size_.rbegin());
}

}  // namespace mc::offload
