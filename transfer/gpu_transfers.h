// GpuTransfers: what the engine's GPU transport offers its callers besides Submit(), handed out
// by TransferEngine::gpu() (null when the engine has no GPU transport). The GPU memory that
// requests may name as local buffers (device ranges, e.g. the imported GPU buffers of
// client/gpu/gpu_buffers.h) is registered here, and with the NIC for GPUDirect RDMA where the
// mode and the hardware allow; the GPU stagers share its device seam and mover; the batch paths
// ask it whether a read into, or a write from, a GPU range is served without staging.
// It hands out no transport: Submit() stays the engine's, which routes every request with a
// local buffer in a device range to the GPU transport. Implemented by the cuda transport
// (transfer/cuda/cuda_transport.h). Thread-safety: every method may be called concurrently.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace mc::transfer {
namespace cuda {
class CudaApi;
class GpuMover;
}  // namespace cuda

class GpuTransfers {
 public:
  virtual ~GpuTransfers() = default;

  // The device seam and the mover of the engine's device (the GPU buffer registry imports
  // through the seam; the GPU stagers copy and hash through the mover). Live as long as the
  // engine.
  virtual cuda::CudaApi& api() = 0;
  virtual cuda::GpuMover& mover() = 0;

  // Device memory of this process that requests may name as local buffers, from now on / no
  // longer (requests naming it after removal are no longer routed to the GPU transport).
  virtual void AddDeviceRange(uint64_t base, uint64_t length) = 0;
  virtual void RemoveDeviceRange(uint64_t base) = 0;

  // GPUDirect RDMA: registers the whole pages of the import [device_addr, device_addr + length)
  // with the NIC (a partial last page is not: reads into it are staged). true: registered
  // (UnregisterRdmaDirect when the import closes); false: not (mode off, no rdma, or it failed
  // under mode auto: logged); an error only under mode on (UNAVAILABLE).
  virtual absl::StatusOr<bool> RegisterRdmaDirect(uint64_t device_addr, uint64_t length) = 0;
  // Blocks until no transfer uses the registration, then releases it.
  virtual void UnregisterRdmaDirect(uint64_t device_addr) = 0;

  // Whether a READ of a memory replica on `endpoint` into the GPU range [data, data + length)
  // would be served without staging (over GPUDirect RDMA): the BatchGetter's choice between
  // reading directly and staging.
  virtual bool CanReadDirect(const std::string& endpoint, const char* data, uint64_t length) = 0;
  // Whether a WRITE from the GPU range [data, data + length) to a memory replica on `endpoint`
  // is served without staging: a segment of this daemon (a device copy), or a peer over
  // GPUDirect RDMA (the BatchPutter's choice between writing directly and staging).
  virtual bool CanWriteDirect(const std::string& endpoint, const char* data, uint64_t length) = 0;

  // GPUDirect RDMA reads and writes proved so far (tests; the metrics count their bytes).
  virtual uint64_t direct_reads() const = 0;
  virtual uint64_t direct_writes() const = 0;
};

}  // namespace mc::transfer
