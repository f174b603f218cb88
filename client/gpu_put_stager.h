// GpuPutStager: lets a BatchPut item take its bytes from GPU memory (issue 18).
//
// The put path hashes and writes from host memory, so an item with GPU pieces is first staged
// into one host buffer that this daemon allocates: each GPU piece copied by the GPU mover, with
// the device hashing the piece's *source* after the copy on the same stream; host pieces (an
// item may mix them, e.g. a vLLM block's header and its KV runs) copied by the CPU. The staged
// bytes become the item's source only when every GPU piece's CPU XXH3-64 equals its device
// hash; the object's checksum is then a hash of exactly what the device held. A copy that failed,
// ran past the deadline, was short or was changed underneath (the application wrote its buffer
// during the put) fails its item (TRANSFER_FAILED, or CHECKSUM_MISMATCH: never stored, never "the
// copy returned success"), and the rest of the batch goes on.
//
// Staging memory: ranges of a pinned (page-locked) pool of its own, a second GpuGetStager sized
// by --gpu_put_staging_bytes and allocated on the first GPU put, so that the device copies run
// as DMA (pageable memory makes the driver bounce every copy through a pinned buffer of its
// own). An item that does not fit beside the staging in progress fails UNAVAILABLE (retry), one
// larger than the pool INVALID_ARGUMENT. A range is returned when the Staged returned by
// Stage() goes (after the put), except when the device was declared lost during the copies
// (GpuMover: streams that never drained may still write into it): then the pool is never
// reused nor freed.
//
// Cost: one extra copy (device -> staging -> segment) and two hashes (device and CPU) per
// item; a put straight from device memory into a pinned local segment would save the copy and
// is not done.
// Thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "client/batch_types.h"
#include "client/gpu_get_stager.h"
#include "common/clock.h"

namespace mc::client {

struct GpuPutStagerOptions {
  uint64_t max_staging_bytes = uint64_t{256} << 20;  // the pinned pool, all requests together
  int64_t copy_timeout_ms = 10'000;                  // one Stage()'s copies and hashes
};

class GpuPutStager {
 public:
  // The staging memory of one request; frees it (and its share of the budget) when it goes.
  class Staged {
   public:
    Staged() = default;
    ~Staged();
    Staged(Staged&& other) noexcept;
    Staged& operator=(Staged&&) = delete;
    Staged(const Staged&) = delete;
    uint64_t bytes() const { return bytes_; }

   private:
    friend class GpuPutStager;
    uint64_t bytes_ = 0;
    std::vector<GpuGetStager::Lease> leases_;
  };

  // `api` and `mover` (borrowed) serve the device of the GPU buffers; the pinned pool of
  // `options.max_staging_bytes` is this stager's own.
  GpuPutStager(transfer::cuda::CudaApi& api, transfer::cuda::GpuMover& mover,
               GpuPutStagerOptions options, const Clock& clock);

  // For every item with GPU pieces: stages it and points `pieces` at the verified host copy
  // (and sets `checksum`), or sets `input_error`. Items without GPU pieces are left alone.
  Staged Stage(std::vector<PutRequestItem>& items);

  uint64_t staged_bytes_in_use() const { return pool_.bytes_in_use(); }

 private:
  transfer::cuda::GpuMover& mover_;
  const GpuPutStagerOptions options_;
  const Clock& clock_;
  GpuGetStager pool_;  // Reserve() only: the copies here hash their source, not the destination
};

}  // namespace mc::client
