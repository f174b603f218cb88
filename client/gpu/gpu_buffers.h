// GpuBufferRegistry: the GPU memory applications lend mc-client with RegisterGpuBuffer
// (proto/mcstore/v1/gpu.proto, docs/gpu.md).
//
// Register imports the caller's allocation through the CUDA seam (a CUDA IPC handle, or a
// POSIX-fd shareable handle) on the named device, checks that [allocation_offset,
// allocation_offset + size) lies inside what was imported, publishes the range to the cuda
// transport (so transfers naming it go there), registers the import with the NIC for GPUDirect
// RDMA where the transport's mode and the hardware allow (GpuTransfers::RegisterRdmaDirect; with
// --gpu_direct_rdma=on a buffer that cannot be is refused, UNAVAILABLE) and returns an
// id with bit 63 set, which a Slice may name like a shm buffer id. Resolve turns (id, offset,
// length) into a device address after an overflow-safe bounds check and holds the buffer (a
// GpuBufferRef): Unregister during a transfer closes the import only once the in-flight use ends.
// Each buffer belongs to the owner that registered it (the caller's owner key, as for shm
// buffers in client/buffers/buffer_registry.h): Resolve and Unregister with another owner answer
// exactly as for an unknown id, so one caller can neither use nor drop another's GPU memory. What
// it does not do: no byte of GPU memory is read here, and an IPC handle is a capability (whoever
// holds its 64 bytes can open the allocation); the fd path with peer credentials is the
// authenticated one (docs/gpu.md). Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "transfer/cuda/cuda_api.h"
#include "transfer/gpu_transfers.h"

namespace mc::client {

inline constexpr uint64_t kGpuBufferIdBit = uint64_t{1} << 63;
inline bool IsGpuBufferId(uint64_t id) { return (id & kGpuBufferIdBit) != 0; }

struct GpuBufferSpec {
  int device = 0;
  transfer::cuda::GpuHandleKind kind = transfer::cuda::GpuHandleKind::kCudaIpc;
  std::span<const uint8_t> handle;  // kCudaIpc: 64 bytes
  int fd = -1;                      // kPosixFd: borrowed; the caller closes it
  uint64_t allocation_offset = 0;   // the buffer's start inside the allocation
  uint64_t size = 0;                // bytes; > 0
};

// One imported range; closes the import when the last reference goes.
class GpuBuffer {
 public:
  // `rdma_direct`: the import is registered with the NIC (GpuTransfers::RegisterRdmaDirect);
  // released here, before the import closes.
  GpuBuffer(transfer::cuda::CudaApi& api, transfer::GpuTransfers* transport, int device,
            transfer::cuda::ImportedMemory memory, uint64_t base, uint64_t size,
            bool rdma_direct = false)
      : api_(api),
        transport_(transport),
        device_(device),
        memory_(memory),
        base_(base),
        size_(size),
        rdma_direct_(rdma_direct) {}
  ~GpuBuffer();
  GpuBuffer(const GpuBuffer&) = delete;
  GpuBuffer& operator=(const GpuBuffer&) = delete;
  uint64_t base() const { return base_; }  // device address of the buffer's first byte
  uint64_t size() const { return size_; }
  int device() const { return device_; }

 private:
  transfer::cuda::CudaApi& api_;
  transfer::GpuTransfers* const transport_;
  const int device_;
  const transfer::cuda::ImportedMemory memory_;
  const uint64_t base_;
  const uint64_t size_;
  const bool rdma_direct_;
};
using GpuBufferRef = std::shared_ptr<const GpuBuffer>;

class GpuBufferRegistry {
 public:
  // `transport` (nullable) learns each buffer's device range; `api` must outlive the registry
  // and every GpuBufferRef. At most `max_buffers` buffers in all (mc-client --gpu_max_buffers)
  // and `max_buffers_per_owner` of one owner (--gpu_max_buffers_per_caller), registrations in
  // progress included.
  GpuBufferRegistry(transfer::cuda::CudaApi& api, transfer::GpuTransfers* transport,
                    size_t max_buffers = 1024, size_t max_buffers_per_owner = 256)
      : api_(api),
        transport_(transport),
        max_buffers_(max_buffers),
        max_per_owner_(max_buffers_per_owner) {}

  // Errors: INVALID_ARGUMENT (bad device, handle, kind, size, or a range outside the import),
  // NO_SPACE (too many buffers in all or of this owner), UNAVAILABLE (no device),
  // UNAVAILABLE (GPUDirect RDMA required and unavailable).
  absl::StatusOr<uint64_t> Register(const GpuBufferSpec& spec, const std::string& owner = "");
  // NOT_FOUND for an unknown id and for another owner's (the same answer: no oracle).
  absl::Status Unregister(uint64_t buffer_id, std::string_view owner = "");
  // Device address of [offset, offset + length) of buffer `buffer_id` of `owner`, holding it in
  // `*ref`. INVALID_ARGUMENT for an unknown id, another owner's, or a slice outside the buffer.
  absl::StatusOr<uint64_t> Resolve(uint64_t buffer_id, uint64_t offset, uint64_t length,
                                   GpuBufferRef* ref, std::string_view owner = "") const;
  // Drops every buffer of `owner` (its fd session ended); returns how many. A buffer still used
  // by a request stays imported until that request ends.
  size_t ReleaseOwner(std::string_view owner);
  size_t Count() const;

 private:
  transfer::cuda::CudaApi& api_;
  transfer::GpuTransfers* const transport_;
  // Takes one of the caps' slots for a registration of `owner`, or NO_SPACE; Unreserve gives
  // it back (the registration failed, or the buffer went).
  absl::Status Reserve(const std::string& owner);
  void UnreserveLocked(const std::string& owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_buffers_;
  const size_t max_per_owner_;

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  size_t slots_ ABSL_GUARDED_BY(mu_) = 0;  // buffers + registrations in progress
  absl::flat_hash_map<std::string, size_t> owner_slots_ ABSL_GUARDED_BY(mu_);
  struct Entry {
    GpuBufferRef buffer;
    std::string owner;
  };
  absl::flat_hash_map<uint64_t, Entry> buffers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mc::client
