// GpuPutStager: lets a BatchPut item take its bytes from GPU memory (docs/gpu.md).
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
// by --gpu_put_staging_bytes and allocated on the first staged GPU put, so that the device copies
// run as DMA (pageable memory makes the driver bounce every copy through a pinned buffer of its
// own). An item that does not fit beside the staging in progress fails UNAVAILABLE (retry), one
// larger than the pool INVALID_ARGUMENT. A range is returned when the Staged returned by
// Stage() goes (after the put), except when the device was declared lost during the copies
// (GpuMover: streams that never drained may still write into it): then the pool is never
// reused nor freed.
//
// Cost: one extra copy (device -> staging -> segment) and two hashes (device and CPU) per
// item.
//
// Direct puts (with a cuda transport and `direct`): an item that is exactly one GPU slice is not
// staged up front. The device hashes its source (that hash becomes the object's checksum), the
// item is marked `gpu_direct`, and the BatchPutter writes each replica straight from GPU memory
// through the cuda transport (into this daemon's own segment: a device copy; to a peer: GPUDirect
// RDMA), each write proved against that hash (the segment range hashed by the CPU, or the source
// hashed again by the device after the NIC read it). An item with a replica the cuda transport
// cannot write (a peer over TCP, or no GPUDirect) is staged then (StageForWrite) and its staged
// copy must hash to the same checksum. Scattered items (several slices, host and GPU mixed, as a
// vLLM block) are always staged: their checksum is of the whole object, which the device hashes
// only over one contiguous range.
// Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/batch/batch_types.h"
#include "client/batch/gpu_get_stager.h"
#include "common/clock.h"
#include "transfer/gpu_transfers.h"

namespace mc::client {

struct GpuPutStagerOptions {
  uint64_t max_staging_bytes = uint64_t{256} << 20;  // the pinned pool, all requests together
  int64_t copy_timeout_ms = 10'000;                  // one Stage()'s copies and hashes
  bool direct = true;  // direct puts of one-slice GPU items, where a cuda transport is given
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

  // A verified host copy of one direct item (StageForWrite), held until this goes.
  struct HostCopy {
    Staged staged;
    std::vector<LocalBuffer> pieces;  // one: the whole payload in the staging range
  };

  // `api` and `mover` (borrowed) serve the device of the GPU buffers; the pinned pool of
  // `options.max_staging_bytes` is this stager's own. `direct` (nullable, borrowed): the
  // engine's GPU capability, which says which direct puts it writes; null stages every item.
  GpuPutStager(transfer::cuda::CudaApi& api, transfer::cuda::GpuMover& mover,
               GpuPutStagerOptions options, const Clock& clock,
               transfer::GpuTransfers* direct = nullptr);

  // For every item with GPU pieces: stages it and points `pieces` at the verified host copy
  // (and sets `checksum`), or, for a direct put, sets `checksum` to the device hash of its one
  // GPU slice and `gpu_direct`; or sets `input_error`. Items without GPU pieces are left alone.
  Staged Stage(std::vector<PutRequestItem>& items);

  // Whether the replica on `endpoint` of a direct item whose source is `source` can be written
  // straight from GPU memory.
  bool CanWriteDirect(const std::string& endpoint, const LocalBuffer& source) const;
  // Stages a direct item after all (a replica CanWriteDirect refuses): the host copy, proved as
  // Stage() proves it and equal to `checksum` (the device hash the put records), or why not
  // (CHECKSUM_MISMATCH when the source changed since that hash).
  absl::StatusOr<HostCopy> StageForWrite(const PutRequestItem& item, uint64_t checksum);

  uint64_t staged_bytes_in_use() const { return pool_.bytes_in_use(); }

 private:
  Staged StageItems(std::vector<PutRequestItem>& items, bool allow_direct);
  // StageItems' steps. PlanStaging: reserves each staged item's range (host pieces copied at
  // once) and lists the device copies and the direct items' hashes. HashDirectSources: the
  // checksum of each item put straight from GPU memory. CopyAndVerify: runs the device copies
  // and checks each staged piece against the device's hash of its source.
  struct Plan;
  void PlanStaging(std::vector<PutRequestItem>& items, bool allow_direct, Staged& staged,
                   Plan& plan);
  void HashDirectSources(std::vector<PutRequestItem>& items, const Plan& plan, int64_t deadline_ms);
  void CopyAndVerify(std::vector<PutRequestItem>& items, const Plan& plan, int64_t deadline_ms);

  transfer::cuda::GpuMover& mover_;
  transfer::GpuTransfers* const direct_;
  const GpuPutStagerOptions options_;
  const Clock& clock_;
  GpuGetStager pool_;  // Reserve() only: the copies here hash their source, not the destination
};

}  // namespace mc::client
