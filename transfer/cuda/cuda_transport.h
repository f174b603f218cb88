// The `cuda` transport: transfer requests whose local buffers are GPU memory (ranges added with
// AddDeviceRange through the engine's GpuTransfers, transfer/gpu_transfers.h, e.g. imported by
// client/gpu/gpu_buffers.h) and whose segment is one of this
// process's own (pinned with RegisterMemory), moved by the GpuMover: batched copies over a few
// streams. A READ asking for Proof::kDeliveredBytes is hashed on the device, from the
// destination; a WRITE asking for Proof::kWrittenReplica (a put from GPU memory) is hashed by
// the CPU from the segment range it wrote, i.e. the replica as stored.
// GPUDirect RDMA: a READ of a remote memory replica into one contiguous GPU range that was
// registered with the rdma transport (RegisterRdmaDirect: a dma-buf of the import) is handed to
// the rdma transport (through RemoteDma, transfer/remote_dma.h: this transport does not depend
// on it), which lands the bytes straight in GPU memory; then the writes are flushed
// to the device (CudaApi::FlushRdmaWrites) and the destination is hashed on the device, as a
// local copy is. A WRITE from such a range to a remote memory replica is handed over the same
// way; asked for its proof, the device hashes its source after the NIC read it. Any other
// remote request, SSD records and index notices answer kTransferFailed at once, without touching
// memory: the BatchGetter reads such keys into pinned staging memory with the other transports and
// copies them into GPU memory itself (client/batch/gpu_get_stager.h), the BatchPutter writes such
// replicas from a staged host copy (client/batch/gpu_put_stager.h). A READ that wants its proof
// into a scattered (several pieces) device destination is rejected (INVALID_ARGUMENT): the device
// hash covers one contiguous range. Thread-safety: all methods may be called concurrently.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "transfer/cuda/cuda_api.h"
#include "transfer/cuda/gpu_mover.h"
#include "transfer/gpu_transfers.h"
#include "transfer/remote_dma.h"
#include "transfer/segment_table.h"
#include "transfer/transfer_options.h"
#include "transfer/transport.h"

namespace mc::transfer::cuda {

struct CudaTransportOptions {
  std::string local_endpoint;  // requests to other endpoints are refused (but GPUDirect RDMA)
  GpuMoverOptions mover;
  GpuDirectRdma gpu_direct_rdma = GpuDirectRdma::kAuto;
  MetricsRegistry* metrics = nullptr;  // optional: mc_gpu_direct_rdma_* series
};

class CudaTransport final : public Transport, public GpuTransfers {
 public:
  static absl::StatusOr<std::unique_ptr<CudaTransport>> Create(CudaTransportOptions options,
                                                               std::unique_ptr<CudaApi> api,
                                                               SegmentTable& segments);
  ~CudaTransport() override;

  std::string_view name() const override { return "cuda"; }
  void Submit(std::span<const TransferRequest* const> requests, std::span<TransferResult> results,
              int64_t deadline_ms) override;
  // Pins a host segment (kRemote) for DMA. A failure is logged and ignored: copies then go
  // staged. Application buffers (kLocal) are not pinned: GPU copies run between GPU memory and
  // this daemon's segments only.
  absl::Status RegisterMemory(void* base, uint64_t length, MemoryAccess access) override;
  void UnregisterMemory(void* base) override;
  // The requests with a local buffer in a device range.
  bool Claims(const TransferRequest& request) override;

  // GpuTransfers (transfer/gpu_transfers.h).
  CudaApi& api() override { return *api_; }
  GpuMover& mover() override { return *mover_; }
  void AddDeviceRange(uint64_t base, uint64_t length) override;
  void RemoveDeviceRange(uint64_t base) override;
  absl::StatusOr<bool> RegisterRdmaDirect(uint64_t device_addr, uint64_t length) override;
  void UnregisterRdmaDirect(uint64_t device_addr) override;
  bool CanReadDirect(const std::string& endpoint, const char* data, uint64_t length) override;
  bool CanWriteDirect(const std::string& endpoint, const char* data, uint64_t length) override;
  uint64_t direct_reads() const override { return direct_reads_.load(); }
  uint64_t direct_writes() const override { return direct_writes_.load(); }

  // GPUDirect RDMA: `dma` (nullable, borrowed, outlives this; the registry passes the rdma
  // transport) receives the registrations and the direct reads and writes.
  void SetRemoteDma(RemoteDma* dma) { rdma_ = dma; }

 private:
  CudaTransport(CudaTransportOptions options, std::unique_ptr<CudaApi> api, SegmentTable& segments);
  bool IsDevice(const char* p, uint64_t length) const;
  // The one device buffer (a READ's destination, a WRITE's source) of a request that GPUDirect
  // RDMA can serve (see the header), or null.
  const LocalBuffer* DirectBuffer(const TransferRequest& request) const;
  // The GPUDirect RDMA reads and writes of Submit: `direct` indexes into requests/results.
  void SubmitDirect(std::span<const TransferRequest* const> requests,
                    std::span<TransferResult> results, const std::vector<size_t>& direct,
                    int64_t deadline_ms);

  const CudaTransportOptions options_;
  std::unique_ptr<CudaApi> api_;
  std::unique_ptr<GpuMover> mover_;
  SegmentTable& segments_;
  RemoteDma* rdma_ = nullptr;
  // Counts one proved GPUDirect read or write of `bytes` (metrics included).
  void CountDirect(bool read, uint64_t bytes);

  std::atomic<uint64_t> direct_reads_{0};
  std::atomic<uint64_t> direct_writes_{0};
  std::atomic<bool> direct_refusal_logged_{false};
  Counter* direct_bytes_ = nullptr;        // mc_gpu_direct_rdma_bytes_total (null: no metrics)
  Counter* direct_write_bytes_ = nullptr;  // mc_gpu_direct_rdma_write_bytes_total
  Gauge* direct_regions_ = nullptr;        // mc_gpu_direct_rdma_regions

  mutable absl::Mutex mu_;
  std::map<uint64_t, uint64_t> device_ranges_ ABSL_GUARDED_BY(mu_);  // base -> length
  std::map<void*, uint64_t> pinned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mc::transfer::cuda
