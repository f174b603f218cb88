// GpuGetStager: lets a BatchGet fill GPU destinations from any replica (docs/gpu.md).
//
// The cuda transport copies between GPU memory and this daemon's own memory segments only. A
// key whose replicas are elsewhere (another host's memory over TCP or RDMA, an SSD tier), or
// that has further destinations in the same batch, is therefore read into pinned host staging
// memory first, by the ordinary transports and under the ordinary checks (bytes, XXH3-64 of the
// staging bytes as they landed, lease). Only then does the GPU mover copy the staging bytes into
// each GPU destination, batched for the whole request, and hash every destination on the device
// after its copy: a GPU destination is OK only when that device hash equals the checksum
// recorded at put. The CPU never reads or writes GPU memory.
//
// The staging memory is one pinned (page-locked, cudaHostAlloc) pool of `pool_bytes`, allocated
// on first use and cut into contiguous ranges, first fit: a Lease holds one until the get ends.
// When the pool has no room for a key, Reserve fails UNAVAILABLE (retry) and the key's GPU
// destinations fail with it; an object larger than the whole pool fails INVALID_ARGUMENT.
// After the device was declared lost (GpuMover: streams that never drained may still read from
// or write into the pool) the pool is never reused nor freed and every Reserve fails
// UNAVAILABLE; a Lease returned after that gives nothing back.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "transfer/cuda/cuda_api.h"
#include "transfer/cuda/gpu_mover.h"

namespace mc::client {

struct GpuGetStagerOptions {
  uint64_t pool_bytes = uint64_t{256} << 20;  // pinned host memory, all requests together
  int64_t copy_timeout_ms = 10'000;           // one CopyToDevice()'s copies and hashes
  // Named in errors and logs: what the pool serves and the flag that sizes it. A second pool
  // serves GpuPutStager ("puts", --gpu_put_staging_bytes) with Reserve() alone.
  const char* purpose = "gets";
  const char* flag = "--gpu_get_staging_bytes";
};

class GpuGetStager {
 public:
  // One contiguous range of the pool, returned when the Lease goes.
  class Lease {
   public:
    Lease() = default;
    ~Lease();
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    char* data() const { return data_; }
    uint64_t length() const { return length_; }

   private:
    friend class GpuGetStager;
    void Return();
    GpuGetStager* owner_ = nullptr;
    char* data_ = nullptr;
    uint64_t length_ = 0;    // asked for
    uint64_t offset_ = 0;    // in the pool
    uint64_t reserved_ = 0;  // rounded up to kAlign
  };

  // One staging range to copy into one contiguous GPU destination and prove there.
  struct Copy {
    void* device = nullptr;
    const char* staging = nullptr;
    uint64_t length = 0;
    uint64_t checksum = 0;  // the XXH3-64 the destination must hash to
  };

  static constexpr uint64_t kAlign = 256;  // of every range's offset in the pool

  // `api` and `mover` (borrowed) serve the device of the GPU buffers.
  GpuGetStager(transfer::cuda::CudaApi& api, transfer::cuda::GpuMover& mover,
               GpuGetStagerOptions options, const Clock& clock);
  ~GpuGetStager();
  GpuGetStager(const GpuGetStager&) = delete;
  GpuGetStager& operator=(const GpuGetStager&) = delete;

  // `length` (> 0) contiguous bytes of the pool, or UNAVAILABLE (full, not allocated, device
  // lost) / INVALID_ARGUMENT (larger than the pool).
  absl::StatusOr<Lease> Reserve(uint64_t length);

  // Copies every staging range into its device destination in one batched Move and hashes each
  // destination on the device. One status per copy, in order: OK only with every byte copied
  // and the device hash equal to `checksum` (CHECKSUM_MISMATCH otherwise); `bytes` per copy.
  struct Result {
    absl::Status status;
    uint64_t bytes = 0;
  };
  std::vector<Result> CopyToDevice(std::span<const Copy> copies);

  uint64_t pool_bytes() const { return options_.pool_bytes; }
  uint64_t bytes_in_use() const;
  bool lost() const;

 private:
  void Release(uint64_t offset, uint64_t reserved);

  transfer::cuda::CudaApi& api_;
  transfer::cuda::GpuMover& mover_;
  const GpuGetStagerOptions options_;
  const Clock& clock_;

  mutable absl::Mutex mu_;
  char* pool_ ABSL_GUARDED_BY(mu_) = nullptr;               // allocated on the first Reserve
  std::map<uint64_t, uint64_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> length, coalesced
  uint64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_alloc_try_ms_ ABSL_GUARDED_BY(mu_) = 0;  // after a failed AllocPinned
};

}  // namespace mc::client
