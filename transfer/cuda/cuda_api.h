// The CUDA seam: the few runtime calls the GPU mover (transfer/cuda/gpu_mover.h) and the GPU
// buffer registry (client/gpu/gpu_buffers.h) make, behind an interface so that unit tests run them
// against tests/fakes/fake_cuda.h (host memory posing as device memory, with injected failed
// copies, short completions, checksum corruption and a lost device) and production runs them
// over cudart (cuda_api_cudart.cc, built only when the toolkit is found; without it
// OpenCudaApi() answers UNAVAILABLE). No CUDA header is included here: device addresses,
// streams and events travel as integers.
//
// Ordering model (as CUDA's): work enqueued on one stream runs in order; an event recorded on
// a stream completes when everything enqueued before it did. An asynchronous failure (a copy
// fault, a lost device) surfaces at the next QueryEvent/SynchronizeStream of that stream, and a
// lost device fails every later call. Memory passed to an *Async call must stay valid until an
// event recorded after it completed.
// Thread-safety: every method may be called from any thread; a Stream is used by one thread at
// a time (the mover gives each stream to one submitter).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transfer/cuda/hash_range.h"

namespace mc::transfer::cuda {

using Stream = uint64_t;  // cudaStream_t
using Event = uint64_t;   // cudaEvent_t

// One contiguous copy; either side may be device or (registered) host memory: the driver knows
// from the unified address which, so no direction is given.
struct CopyOp {
  void* dst;
  const void* src;
  uint64_t length;
};

// How a process shares device memory with the daemon.
enum class GpuHandleKind : uint8_t {
  kCudaIpc = 1,  // cudaIpcGetMemHandle: 64 opaque bytes; same device ordinal in both
  kPosixFd = 2,  // cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR): an fd (SCM_RIGHTS)
};

// A peer's device memory opened in this process.
struct ImportedMemory {
  uint64_t device_addr = 0;  // where it is mapped in this process
  uint64_t size = 0;         // bytes mapped (at least the size asked for)
  uint64_t token = 0;        // implementation's identity, for CloseImported
};

class CudaApi {
 public:
  virtual ~CudaApi() = default;

  virtual absl::StatusOr<int> DeviceCount() = 0;
  // Name and compute capability of `device`, for logs ("NVIDIA H200 sm_90").
  virtual absl::StatusOr<std::string> DeviceName(int device) = 0;
  // The device's UUID as nvidia-smi prints it: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  // (lowercase hex). Unlike the ordinal it does not depend on CUDA_VISIBLE_DEVICES.
  virtual absl::StatusOr<std::string> DeviceUuid(int device) = 0;

  // Opens another process's allocation on `device`. kCudaIpc: `handle` holds the 64 bytes of a
  // cudaIpcMemHandle_t; kPosixFd: `fd` is the shareable handle (the caller keeps and closes
  // it). `size` is the range the caller claims; an import smaller than that is an error.
  virtual absl::StatusOr<ImportedMemory> Import(int device, GpuHandleKind kind,
                                                std::span<const uint8_t> handle, int fd,
                                                uint64_t size) = 0;
  virtual void CloseImported(int device, const ImportedMemory& memory) = 0;

  // Page-locks host memory (a segment) so that copies to and from it are DMA, not staged.
  virtual absl::Status HostRegister(void* base, uint64_t length) = 0;
  virtual void HostUnregister(void* base) = 0;
  // Pinned, device-visible host memory for descriptors and results (kernel arguments).
  virtual absl::StatusOr<void*> AllocPinned(uint64_t length) = 0;
  virtual void FreePinned(void* p) = 0;

  virtual absl::StatusOr<Stream> CreateStream(int device) = 0;
  virtual void DestroyStream(Stream stream) = 0;

  // Enqueues `ops` on `stream` as one batched submission (cudaMemcpyBatchAsync on CUDA >= 12.8,
  // else one cudaMemcpyAsync each). An error means nothing after the failing op was enqueued.
  virtual absl::Status CopyBatchAsync(Stream stream, std::span<const CopyOp> ops) = 0;
  // Enqueues the XXH3 kernel: out[i] = XXH3-64(ranges[i]). `ranges` and `out` are in
  // AllocPinned memory and must stay valid until an event recorded after this completed.
  virtual absl::Status HashAsync(Stream stream, const HashRange* ranges, uint64_t* out,
                                 uint32_t count) = 0;

  virtual absl::StatusOr<Event> RecordEvent(Stream stream) = 0;
  // true: everything before the event completed; false: not yet; error: a copy or kernel
  // before it failed (the stream's work is then in an unknown state), or the device is lost.
  virtual absl::StatusOr<bool> QueryEvent(Event event) = 0;
  virtual void DestroyEvent(Event event) = 0;
  // Blocks until the stream is idle (or fails).
  virtual absl::Status SynchronizeStream(Stream stream) = 0;

  // GPUDirect RDMA (docs/gpu.md). A dma-buf fd for [device_addr, device_addr + length) of memory
  // on `device` (cuMemGetHandleForAddressRange), for a NIC to register (ibv_reg_dmabuf_mr). The
  // range must lie inside one allocation (imported ones included), and its start and length be
  // multiples of the host page size. The caller closes the fd. UNAVAILABLE when the
  // device or driver cannot export dma-bufs, INVALID_ARGUMENT for a range it refuses.
  virtual absl::StatusOr<int> ExportDmaBuf(int device, uint64_t device_addr, uint64_t length) = 0;
  // Makes the GPUDirect RDMA writes into `device`'s memory whose completions were seen visible to
  // work enqueued afterwards (cuFlushGPUDirectRDMAWrites to the owner; nothing to do on devices
  // that order such writes themselves). An error means later work may read stale bytes.
  virtual absl::Status FlushRdmaWrites(int device) = 0;
};

// 16 UUID bytes as "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (nvidia-smi's form).
std::string FormatGpuUuid(std::span<const uint8_t> bytes);
// Whether `given` names the UUID `canonical` (FormatGpuUuid's form): case-insensitive, with or
// without the "GPU-" prefix.
bool SameGpuUuid(std::string_view given, std::string_view canonical);

// The cudart implementation (device lost / no driver: the error). Built only with MC_WITH_CUDA;
// otherwise kUnavailable.
absl::StatusOr<std::unique_ptr<CudaApi>> OpenCudaApi();

}  // namespace mc::transfer::cuda
