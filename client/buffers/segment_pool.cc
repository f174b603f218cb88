#include "client/buffers/segment_pool.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace mc::client {

absl::StatusOr<std::unique_ptr<SegmentPool>> SegmentPool::Create(
    const SegmentPoolOptions& options) {
  std::unique_ptr<SegmentPool> pool(new SegmentPool());
  if (options.segment_size == 0) return pool;
  if (options.segment_count <= 0) {
    return McError(Code::kInvalidArgument, "segment count must be positive");
  }
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  if (options.prefault) flags |= MAP_POPULATE;
  for (int i = 0; i < options.segment_count; ++i) {
    void* base = MAP_FAILED;
    if (options.huge_pages) {
      base =
          mmap(nullptr, options.segment_size, PROT_READ | PROT_WRITE, flags | MAP_HUGETLB, -1, 0);
      if (base == MAP_FAILED) {
        Logger("client").warn("huge pages unavailable for segment {} ({}); using normal pages", i,
                              std::strerror(errno));
      }
    }
    if (base == MAP_FAILED) {
      base = mmap(nullptr, options.segment_size, PROT_READ | PROT_WRITE, flags, -1, 0);
    }
    if (base == MAP_FAILED) {
      return McError(Code::kNoSpace, absl::StrCat("cannot map a segment of ", options.segment_size,
                                                  " bytes: ", std::strerror(errno)));
    }
    pool->segments_.push_back({static_cast<char*>(base), options.segment_size});
  }
  return pool;
}

SegmentPool::~SegmentPool() {
  for (const Segment& s : segments_) munmap(s.base, s.size);
}

void SegmentPool::Publish(const std::vector<uint64_t>& ids, transfer::SegmentTable& table) {
  absl::MutexLock lock(&mu_);
  for (uint64_t old : published_ids_) table.Remove(old);
  published_ids_.clear();
  for (size_t i = 0; i < ids.size() && i < segments_.size(); ++i) {
    table.Add(ids[i], segments_[i].base, segments_[i].size);
    published_ids_.push_back(ids[i]);
  }
}

std::optional<size_t> SegmentPool::LocalIndexOf(uint64_t segment_id) const {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < published_ids_.size(); ++i) {
    if (published_ids_[i] == segment_id) return i;
  }
  return std::nullopt;
}

std::vector<uint64_t> SegmentPool::published_ids() const {
  absl::MutexLock lock(&mu_);
  return published_ids_;
}

}  // namespace mc::client
