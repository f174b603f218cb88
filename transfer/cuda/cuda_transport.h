// The `cuda` transport: transfer requests whose local buffers are GPU memory (ranges added with
// AddDeviceRange, e.g. imported by client/gpu_buffers.h) and whose segment is one of this
// process's own (pinned with RegisterMemory), moved by the GpuMover: batched copies over a few
// streams, and a READ asking for a checksum is hashed on the device, from the destination.
// A remote segment and kReadDisk answer kTransferFailed at once, without touching memory: the
// BatchGetter reads such keys into pinned staging memory with the other transports and copies
// them into GPU memory itself (client/gpu_get_stager.h); GPUDirect RDMA is not done; a READ that
// wants a checksum into a scattered (several pieces) device destination is rejected
// (INVALID_ARGUMENT): the device hash covers one contiguous range. Thread-safety: all methods may
// be called concurrently.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "transfer/cuda/cuda_api.h"
#include "transfer/cuda/gpu_mover.h"
#include "transfer/transport.h"

namespace mc::transfer::cuda {

struct CudaTransportOptions {
  std::string local_endpoint;  // requests to other endpoints are refused
  GpuMoverOptions mover;
};

class CudaTransport final : public Transport {
 public:
  static absl::StatusOr<std::unique_ptr<CudaTransport>> Create(CudaTransportOptions options,
                                                               std::unique_ptr<CudaApi> api,
                                                               SegmentTable& segments);
  ~CudaTransport() override;

  std::string_view name() const override { return "cuda"; }
  void Submit(std::span<const TransferRequest* const> requests, std::span<TransferResult> results,
              int64_t deadline_ms) override;
  // Pins a host segment for DMA. A failure is logged and ignored: copies then go staged.
  absl::Status RegisterMemory(void* base, uint64_t length, MemoryAccess access) override;
  void UnregisterMemory(void* base) override;

  // Device memory of this process that requests may name as local buffers.
  void AddDeviceRange(uint64_t base, uint64_t length);
  void RemoveDeviceRange(uint64_t base);
  // True when a local buffer of `request` lies in a device range (the registry's choice).
  bool HandlesRequest(const TransferRequest& request) const;

  CudaApi& api() { return *api_; }
  GpuMover& mover() { return *mover_; }

 private:
  CudaTransport(CudaTransportOptions options, std::unique_ptr<CudaApi> api, SegmentTable& segments);
  bool IsDevice(const char* p, uint64_t length) const;

  const CudaTransportOptions options_;
  std::unique_ptr<CudaApi> api_;
  std::unique_ptr<GpuMover> mover_;
  SegmentTable& segments_;

  mutable absl::Mutex mu_;
  std::map<uint64_t, uint64_t> device_ranges_ ABSL_GUARDED_BY(mu_);  // base -> length
  std::map<void*, uint64_t> pinned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mc::transfer::cuda
