// CudaApi over the CUDA runtime (cudart, linked statically: it loads the driver on first use,
// so binaries start on machines without one and OpenCudaApi() then answers UNAVAILABLE). The
// driver calls of the POSIX-fd import (cuMemImportFromShareableHandle and the VMM mapping) and of
// the dma-buf export for GPUDirect RDMA (cuMemGetHandleForAddressRange) are fetched through
// cudaGetDriverEntryPointByVersion, so nothing links libcuda. Built only with MC_WITH_CUDA;
// otherwise OpenCudaApi() answers UNAVAILABLE.
#include "common/status.h"
#include "common/status_macros.h"
#include "transfer/cuda/cuda_api.h"

#if MC_WITH_CUDA
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "transfer/cuda/xxh3_kernel.h"
#endif

namespace mc::transfer::cuda {

std::string FormatGpuUuid(std::span<const uint8_t> bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out.push_back(kHex[bytes[i] >> 4]);
    out.push_back(kHex[bytes[i] & 0xf]);
  }
  return out;
}

bool SameGpuUuid(std::string_view given, std::string_view canonical) {
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  auto same = [&](std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (lower(a[i]) != lower(b[i])) return false;
    }
    return true;
  };
  auto strip = [&](std::string_view u) {
    if (u.size() >= 4 && same(u.substr(0, 4), "gpu-")) u.remove_prefix(4);
    return u;
  };
  given = strip(given);
  canonical = strip(canonical);
  return !given.empty() && same(given, canonical);
}

#if !MC_WITH_CUDA

absl::StatusOr<std::unique_ptr<CudaApi>> OpenCudaApi() {
  return McError(Code::kUnavailable, "cuda: built without the CUDA toolkit");
}

#else

namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  return McError(
      e == cudaErrorDevicesUnavailable || e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver
          ? Code::kUnavailable
          : Code::kTransferFailed,
      std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

#define MC_CUDA_RETURN(call, what)                        \
  do {                                                    \
    if (cudaError_t mc_e = (call); mc_e != cudaSuccess) { \
      return CudaError(mc_e, what);                       \
    }                                                     \
  } while (0)

// Driver entry points of the shareable-handle import.
struct DriverVmm {
  decltype(&cuMemImportFromShareableHandle) import_handle = nullptr;
  decltype(&cuMemGetAllocationPropertiesFromHandle) properties = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  bool ok = false;
};

template <typename F>
bool Entry(const char* name, F* f) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult result;
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &result) !=
          cudaSuccess ||
      result != cudaDriverEntryPointSuccess) {
    return false;
  }
  *f = reinterpret_cast<F>(p);
  return true;
}

// Driver entry points of the dma-buf export (GPUDirect RDMA).
struct DriverDmaBuf {
  decltype(&cuDeviceGet) device_get = nullptr;
  decltype(&cuDeviceGetAttribute) attribute = nullptr;
  decltype(&cuMemGetHandleForAddressRange) handle = nullptr;
  bool ok = false;
};

DriverDmaBuf LoadDmaBuf() {
  DriverDmaBuf d;
  d.ok = Entry("cuDeviceGet", &d.device_get) && Entry("cuDeviceGetAttribute", &d.attribute) &&
         Entry("cuMemGetHandleForAddressRange", &d.handle);
  return d;
}

class CudartApi final : public CudaApi {
 public:
  CudartApi() {
    vmm_.ok = Entry("cuMemImportFromShareableHandle", &vmm_.import_handle) &&
              Entry("cuMemGetAllocationPropertiesFromHandle", &vmm_.properties) &&
              Entry("cuMemGetAllocationGranularity", &vmm_.granularity) &&
              Entry("cuMemAddressReserve", &vmm_.reserve) && Entry("cuMemMap", &vmm_.map) &&
              Entry("cuMemSetAccess", &vmm_.set_access) && Entry("cuMemUnmap", &vmm_.unmap) &&
              Entry("cuMemAddressFree", &vmm_.address_free) && Entry("cuMemRelease", &vmm_.release);
  }

  absl::StatusOr<int> DeviceCount() override {
    int n = 0;
    MC_CUDA_RETURN(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    return n;
  }
  absl::StatusOr<std::string> DeviceName(int device) override {
    cudaDeviceProp prop;
    MC_CUDA_RETURN(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    return std::string(prop.name) + " sm_" + std::to_string(prop.major) +
           std::to_string(prop.minor);
  }

  absl::StatusOr<std::string> DeviceUuid(int device) override {
    cudaDeviceProp prop;
    MC_CUDA_RETURN(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    return FormatGpuUuid(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(prop.uuid.bytes),
                                                  sizeof(prop.uuid.bytes)));
  }

  absl::StatusOr<ImportedMemory> Import(int device, GpuHandleKind kind,
                                        std::span<const uint8_t> handle, int fd,
                                        uint64_t size) override {
    MC_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
    if (kind == GpuHandleKind::kCudaIpc) {
      cudaIpcMemHandle_t h;
      if (handle.size() != sizeof(h)) {
        return McError(Code::kInvalidArgument, "cuda ipc handle must be 64 bytes");
      }
      std::memcpy(&h, handle.data(), sizeof(h));
      void* p = nullptr;
      MC_CUDA_RETURN(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
                     "cudaIpcOpenMemHandle");
      // The IPC handle names a whole allocation starting at p; its extent is the allocation's.
      // Fail closed: a range past the allocation would fault the device (a sticky error that
      // ends every GPU transfer of this process), so an extent we cannot learn is refused.
      CUdeviceptr base = 0;
      size_t extent = 0;
      const auto addr = reinterpret_cast<CUdeviceptr>(p);
      if (!cuMemGetAddressRangeFn(addr, &base, &extent) || addr < base || addr - base > extent ||
          size > extent - (addr - base)) {
        cudaIpcCloseMemHandle(p);
        return McError(Code::kInvalidArgument,
                       "cuda allocation smaller than claimed (or its extent is unknown)");
      }
      return ImportedMemory{reinterpret_cast<uint64_t>(p), size, 0};
    }
    if (!vmm_.ok) return McError(Code::kUnavailable, "driver lacks the VMM import calls");
    CUmemGenericAllocationHandle h;
    if (CUresult r = vmm_.import_handle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        r != CUDA_SUCCESS) {
      return McError(Code::kInvalidArgument,
                     "cuMemImportFromShareableHandle failed: " + std::to_string(r));
    }
    CUmemAllocationProp prop{};
    size_t granularity = 0;
    if (vmm_.properties(&prop, h) != CUDA_SUCCESS ||
        vmm_.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
        granularity == 0) {
      vmm_.release(h);
      return McError(Code::kTransferFailed, "cuda: allocation properties unavailable");
    }
    const uint64_t mapped = (size + granularity - 1) / granularity * granularity;
    CUdeviceptr addr = 0;
    if (vmm_.reserve(&addr, mapped, granularity, 0, 0) != CUDA_SUCCESS) {
      vmm_.release(h);
      return McError(Code::kTransferFailed, "cuMemAddressReserve failed");
    }
    if (vmm_.map(addr, mapped, 0, h, 0) != CUDA_SUCCESS) {  // fails when the allocation is smaller
      vmm_.address_free(addr, mapped);
      vmm_.release(h);
      return McError(Code::kInvalidArgument, "cuMemMap failed (allocation smaller than claimed?)");
    }
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (vmm_.set_access(addr, mapped, &access, 1) != CUDA_SUCCESS) {
      vmm_.unmap(addr, mapped);
      vmm_.address_free(addr, mapped);
      vmm_.release(h);
      return McError(Code::kTransferFailed, "cuMemSetAccess failed");
    }
    absl::MutexLock lock(&mu_);
    const uint64_t token = next_token_++;
    vmm_imports_[token] = VmmImport{h, addr, mapped};
    return ImportedMemory{addr, mapped, token};
  }

  void CloseImported(int device, const ImportedMemory& memory) override {
    cudaSetDevice(device);
    if (memory.token == 0) {
      cudaIpcCloseMemHandle(reinterpret_cast<void*>(memory.device_addr));
      return;
    }
    VmmImport v;
    {
      absl::MutexLock lock(&mu_);
      auto it = vmm_imports_.find(memory.token);
      if (it == vmm_imports_.end()) return;
      v = it->second;
      vmm_imports_.erase(it);
    }
    vmm_.unmap(v.addr, v.size);
    vmm_.address_free(v.addr, v.size);
    vmm_.release(v.handle);
  }

  absl::Status HostRegister(void* base, uint64_t length) override {
    MC_CUDA_RETURN(cudaHostRegister(base, length, cudaHostRegisterPortable), "cudaHostRegister");
    return absl::OkStatus();
  }
  void HostUnregister(void* base) override { cudaHostUnregister(base); }
  absl::StatusOr<void*> AllocPinned(uint64_t length) override {
    void* p = nullptr;
    MC_CUDA_RETURN(cudaHostAlloc(&p, length, cudaHostAllocPortable | cudaHostAllocMapped),
                   "cudaHostAlloc");
    return p;
  }
  void FreePinned(void* p) override { cudaFreeHost(p); }

  absl::StatusOr<Stream> CreateStream(int device) override {
    MC_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
    cudaStream_t s;
    MC_CUDA_RETURN(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    absl::MutexLock lock(&mu_);
    stream_device_[reinterpret_cast<Stream>(s)] = device;
    return reinterpret_cast<Stream>(s);
  }
  void DestroyStream(Stream stream) override {
    cudaStreamDestroy(reinterpret_cast<cudaStream_t>(stream));
    absl::MutexLock lock(&mu_);
    stream_device_.erase(stream);
  }

  absl::Status CopyBatchAsync(Stream stream, std::span<const CopyOp> ops) override {
    const auto s = reinterpret_cast<cudaStream_t>(stream);
    if (ops.empty()) return absl::OkStatus();
    MC_RETURN_IF_ERROR(OnDeviceOf(stream));
#if CUDART_VERSION >= 12080
    thread_local std::vector<void*> dsts;
    thread_local std::vector<const void*> srcs;
    thread_local std::vector<size_t> sizes;
    dsts.clear();
    srcs.clear();
    sizes.clear();
    for (const CopyOp& op : ops) {
      dsts.push_back(op.dst);
      srcs.push_back(op.src);
      sizes.push_back(op.length);
    }
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attr_index = 0;
#if CUDART_VERSION >= 13000
    MC_CUDA_RETURN(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), ops.size(), &attr,
                                        &attr_index, 1, s),
                   "cudaMemcpyBatchAsync");
#else
    size_t fail_index = 0;
    MC_CUDA_RETURN(cudaMemcpyBatchAsync(dsts.data(), const_cast<void**>(srcs.data()), sizes.data(),
                                        ops.size(), &attr, &attr_index, 1, &fail_index, s),
                   "cudaMemcpyBatchAsync");
#endif
#else
    for (const CopyOp& op : ops) {
      MC_CUDA_RETURN(cudaMemcpyAsync(op.dst, op.src, op.length, cudaMemcpyDefault, s),
                     "cudaMemcpyAsync");
    }
#endif
    return absl::OkStatus();
  }

  absl::Status HashAsync(Stream stream, const HashRange* ranges, uint64_t* out,
                         uint32_t count) override {
    MC_RETURN_IF_ERROR(OnDeviceOf(stream));
    MC_CUDA_RETURN(static_cast<cudaError_t>(
                       LaunchXxh3Kernel(ranges, out, count, reinterpret_cast<void*>(stream))),
                   "xxh3 kernel launch");
    return absl::OkStatus();
  }

  absl::StatusOr<Event> RecordEvent(Stream stream) override {
    MC_RETURN_IF_ERROR(OnDeviceOf(stream));  // an event must belong to its stream's device
    cudaEvent_t e;
    MC_CUDA_RETURN(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    if (cudaError_t r = cudaEventRecord(e, reinterpret_cast<cudaStream_t>(stream));
        r != cudaSuccess) {
      cudaEventDestroy(e);
      return CudaError(r, "cudaEventRecord");
    }
    return reinterpret_cast<Event>(e);
  }
  absl::StatusOr<bool> QueryEvent(Event event) override {
    const cudaError_t r = cudaEventQuery(reinterpret_cast<cudaEvent_t>(event));
    if (r == cudaSuccess) return true;
    if (r == cudaErrorNotReady) return false;
    return CudaError(r, "cudaEventQuery");
  }
  void DestroyEvent(Event event) override {
    cudaEventDestroy(reinterpret_cast<cudaEvent_t>(event));
  }
  absl::Status SynchronizeStream(Stream stream) override {
    MC_CUDA_RETURN(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)),
                   "cudaStreamSynchronize");
    return absl::OkStatus();
  }

  absl::StatusOr<int> ExportDmaBuf(int device, uint64_t device_addr, uint64_t length) override {
    static const DriverDmaBuf d = LoadDmaBuf();
    if (!d.ok) {
      return McError(Code::kUnavailable,
                     "the CUDA driver lacks cuMemGetHandleForAddressRange (dma-buf export)");
    }
    MC_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
    CUdevice dev = 0;
    int supported = 0;
    if (d.device_get(&dev, device) != CUDA_SUCCESS ||
        d.attribute(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev) != CUDA_SUCCESS ||
        supported == 0) {
      return McError(Code::kUnavailable,
                     "device " + std::to_string(device) +
                         " does not export dma-bufs (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED; "
                         "needs the open kernel modules, driver >= 515, Linux >= 5.12)");
    }
    const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    if (length == 0 || device_addr % page != 0 || length % page != 0) {
      return McError(Code::kInvalidArgument, "dma-buf export: range not page-aligned");
    }
    CUdeviceptr base = 0;
    size_t extent = 0;
    if (!cuMemGetAddressRangeFn(device_addr, &base, &extent) || device_addr < base ||
        device_addr - base > extent || length > extent - (device_addr - base)) {
      return McError(Code::kInvalidArgument, "dma-buf export: range outside one allocation");
    }
    int fd = -1;
    if (CUresult r = d.handle(&fd, device_addr, length, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
        r != CUDA_SUCCESS || fd < 0) {
      return McError(Code::kUnavailable,
                     "cuMemGetHandleForAddressRange(DMA_BUF_FD) failed: " + std::to_string(r));
    }
    return fd;
  }

  absl::Status FlushRdmaWrites(int device) override {
    MC_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
    int ordering = 0;
    MC_CUDA_RETURN(
        cudaDeviceGetAttribute(&ordering, cudaDevAttrGPUDirectRDMAWritesOrdering, device),
        "cudaDeviceGetAttribute(GPUDirectRDMAWritesOrdering)");
    if (ordering >= cudaGPUDirectRDMAWritesOrderingOwner) return absl::OkStatus();  // in order
    MC_CUDA_RETURN(
        cudaDeviceFlushGPUDirectRDMAWrites(cudaFlushGPUDirectRDMAWritesTargetCurrentDevice,
                                           cudaFlushGPUDirectRDMAWritesToOwner),
        "cudaDeviceFlushGPUDirectRDMAWrites");
    return absl::OkStatus();
  }

 private:
  // The calling thread's current device becomes the stream's: kernels and events of a stream
  // must be issued on its device, and callers run on any thread.
  absl::Status OnDeviceOf(Stream stream) {
    int device = 0;
    {
      absl::MutexLock lock(&mu_);
      auto it = stream_device_.find(stream);
      if (it == stream_device_.end()) return McError(Code::kInternal, "cuda: unknown stream");
      device = it->second;
    }
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current == device) return absl::OkStatus();
    MC_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
    return absl::OkStatus();
  }

  struct VmmImport {
    CUmemGenericAllocationHandle handle = 0;
    CUdeviceptr addr = 0;
    size_t size = 0;
  };
  // cuMemGetAddressRange through the entry-point table; false when unavailable.
  static bool cuMemGetAddressRangeFn(CUdeviceptr p, CUdeviceptr* base, size_t* extent) {
    static decltype(&cuMemGetAddressRange) f = [] {
      decltype(&cuMemGetAddressRange) fn = nullptr;
      return Entry("cuMemGetAddressRange", &fn) ? fn : nullptr;
    }();
    return f != nullptr && f(base, extent, p) == CUDA_SUCCESS;
  }

  DriverVmm vmm_;
  absl::Mutex mu_;
  uint64_t next_token_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, VmmImport> vmm_imports_ ABSL_GUARDED_BY(mu_);
  std::map<Stream, int> stream_device_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaApi>> OpenCudaApi() {
  int n = 0;
  if (cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess) {
    return McError(Code::kUnavailable, std::string("cuda: no usable device: ") +
                                           cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                                           ")");
  }
  if (n == 0) return McError(Code::kUnavailable, "cuda: no device");
  return std::unique_ptr<CudaApi>(new CudartApi());
}

#endif  // MC_WITH_CUDA

}  // namespace mc::transfer::cuda
