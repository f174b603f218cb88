#include "client/batch/gpu_get_stager.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace mc::client {

namespace {
constexpr int64_t kAllocRetryMs = 10'000;  // after AllocPinned failed
}  // namespace

GpuGetStager::Lease::~Lease() { Return(); }

GpuGetStager::Lease::Lease(Lease&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      length_(std::exchange(other.length_, 0)),
      offset_(std::exchange(other.offset_, 0)),
      reserved_(std::exchange(other.reserved_, 0)) {}

GpuGetStager::Lease& GpuGetStager::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Return();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    length_ = std::exchange(other.length_, 0);
    offset_ = std::exchange(other.offset_, 0);
    reserved_ = std::exchange(other.reserved_, 0);
  }
  return *this;
}

void GpuGetStager::Lease::Return() {
  if (owner_ != nullptr) owner_->Release(offset_, reserved_);
  owner_ = nullptr;
  data_ = nullptr;
  length_ = reserved_ = offset_ = 0;
}

GpuGetStager::GpuGetStager(transfer::cuda::CudaApi& api, transfer::cuda::GpuMover& mover,
                           GpuGetStagerOptions options, const Clock& clock)
    : api_(api), mover_(mover), options_(options), clock_(clock) {}

GpuGetStager::~GpuGetStager() {
  absl::MutexLock lock(&mu_);
  // Leases must be gone by now (they point here); a lost device may still read the pool.
  if (pool_ != nullptr && !lost_ && !mover_.device_lost() && in_use_ == 0) {
    api_.FreePinned(pool_);
  }
}

absl::StatusOr<GpuGetStager::Lease> GpuGetStager::Reserve(uint64_t length) {
  if (length == 0) return McError(Code::kInvalidArgument, "nothing to stage");
  if (length > options_.pool_bytes) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat(length, " bytes to stage for GPU ", options_.purpose, " exceed ",
                                options_.flag, "=", options_.pool_bytes,
                                " (the pinned memory they are staged through)"));
  }
  // Rounded up without overflow (the pool, and so `length`, may be any size here).
  const uint64_t reserved = length / kAlign * kAlign + (length % kAlign != 0 ? kAlign : 0);
  absl::MutexLock lock(&mu_);
  if (lost_ || mover_.device_lost()) {
    lost_ = true;
    return McError(Code::kUnavailable, absl::StrCat("the GPU device was lost: GPU ",
                                                    options_.purpose, " fail (restart mc-client)"));
  }
  if (pool_ == nullptr) {
    const int64_t now = clock_.NowMs();
    if (now < next_alloc_try_ms_) {
      return McError(Code::kUnavailable, absl::StrCat("no pinned staging memory for GPU ",
                                                      options_.purpose, " (see the log)"));
    }
    absl::StatusOr<void*> pool = api_.AllocPinned(options_.pool_bytes);
    if (!pool.ok()) {
      next_alloc_try_ms_ = now + kAllocRetryMs;
      Logger("client").error(
          "cannot allocate {} bytes of pinned staging memory for GPU {}: {}; what needs staging "
          "fails UNAVAILABLE (retried in {} s; lower {}?)",
          options_.pool_bytes, options_.purpose, pool.status().ToString(), kAllocRetryMs / 1000,
          options_.flag);
      return McError(Code::kUnavailable,
                     absl::StrCat("no pinned staging memory for GPU ", options_.purpose, ": ",
                                  pool.status().message()));
    }
    pool_ = static_cast<char*>(*pool);
    free_.clear();
    free_[0] = options_.pool_bytes;
  }
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    // A free range shorter than `reserved` only at the pool's end (not a multiple of kAlign)
    // may still hold `length`.
    const uint64_t take = std::min(reserved, it->second);
    if (take < length) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - take;
    free_.erase(it);
    if (rest > 0) free_[offset + take] = rest;
    in_use_ += take;
    Lease lease;
    lease.owner_ = this;
    lease.data_ = pool_ + offset;
    lease.length_ = length;
    lease.offset_ = offset;
    lease.reserved_ = take;
    return lease;
  }
  return McError(
      Code::kUnavailable,
      absl::StrCat("GPU ", options_.purpose, " staging memory is in use by other requests (",
                   in_use_, " of ", options_.flag, "=", options_.pool_bytes, " bytes); retry"));
}

void GpuGetStager::Release(uint64_t offset, uint64_t reserved) {
  absl::MutexLock lock(&mu_);
  if (lost_ || mover_.device_lost()) {  // never reused: the device may still use it
    lost_ = true;
    return;
  }
  in_use_ -= reserved;
  auto next = free_.lower_bound(offset);
  uint64_t begin = offset, length = reserved;
  if (next != free_.end() && next->first == offset + reserved) {
    length += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      begin = prev->first;
      length += prev->second;
      free_.erase(prev);
    }
  }
  free_[begin] = length;
}

std::vector<GpuGetStager::Result> GpuGetStager::CopyToDevice(std::span<const Copy> copies) {
  std::vector<transfer::cuda::GpuMoveRequest> requests(copies.size());
  for (size_t i = 0; i < copies.size(); ++i) {
    requests[i].copies.push_back(
        transfer::cuda::CopyOp{copies[i].device, copies[i].staging, copies[i].length});
    requests[i].hash_destination = true;
    requests[i].expected_checksum = copies[i].checksum;
  }
  const std::vector<transfer::cuda::GpuMoveResult> moved =
      mover_.Move(requests, clock_.NowMs() + options_.copy_timeout_ms);
  if (mover_.device_lost()) {
    absl::MutexLock lock(&mu_);
    if (!lost_) {
      lost_ = true;
      Logger("client").error(
          "GPU device lost while copying {} staged get(s) into GPU memory: the pinned staging "
          "pool ({} bytes) is never reused nor freed; GPU gets now fail (restart mc-client)",
          copies.size(), options_.pool_bytes);
    }
  }
  std::vector<Result> results(copies.size());
  for (size_t i = 0; i < copies.size(); ++i) {
    const transfer::cuda::GpuMoveResult& m = moved[i];
    results[i].bytes = m.bytes;
    if (!m.status.ok()) {
      results[i].status =
          ToCode(m.status) == Code::kChecksumMismatch
              ? McError(Code::kChecksumMismatch,
                        "the bytes that landed in GPU memory failed the checksum (device hash of "
                        "the destination after the copy from verified staging memory)")
              : m.status;
    } else if (!m.checksum.has_value()) {
      results[i].status = McError(Code::kTransferFailed, "cuda: no device hash of the destination");
    } else if (*m.checksum != copies[i].checksum) {
      results[i].status = McError(Code::kChecksumMismatch,
                                  "the bytes that landed in GPU memory failed the checksum");
    } else if (m.bytes != copies[i].length) {
      results[i].status =
          McError(Code::kTransferFailed, absl::StrCat("cuda: ", m.bytes, " of ", copies[i].length,
                                                      " bytes copied into GPU memory"));
    }
  }
  return results;
}

uint64_t GpuGetStager::bytes_in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

bool GpuGetStager::lost() const {
  absl::MutexLock lock(&mu_);
  return lost_;
}

}  // namespace mc::client
