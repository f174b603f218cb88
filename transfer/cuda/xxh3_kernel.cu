// The device XXH3-64 kernel: one thread block per destination range. Short ranges (<= 240
// bytes) are hashed by one thread. Long ranges go 32 blocks of 1 KiB at a time: 256 threads
// compute the per-lane contributions of those 32 blocks in parallel (Xxh3LaneBlockSum), then
// 8 threads fold them in order (Xxh3ScrambleLane), and thread 0 adds the tail and merges
// (Xxh3LongFinish). The arithmetic is transfer/cuda/xxh3_hd.h, tested on the CPU against
// libxxhash; bench/gpu_check.sh compares this kernel's output with the CPU on the device.
#include <cuda_runtime.h>

#include "transfer/cuda/xxh3_hd.h"
#include "transfer/cuda/xxh3_kernel.h"

namespace mc::transfer::cuda {
namespace {

__constant__ uint8_t kDeviceSecret[xxh3::kSecretSize] = MC_XXH3_SECRET_BYTES;

constexpr unsigned kThreads = 256;
constexpr unsigned kBlocksPerRound = kThreads / 8;  // 1 KiB blocks folded per round

__global__ void __launch_bounds__(kThreads)
    Xxh3Kernel(const HashRange* ranges, uint64_t* out, uint32_t count) {
  __shared__ uint64_t acc[8];
  __shared__ uint64_t contrib[kBlocksPerRound][8];
  for (uint32_t r = blockIdx.x; r < count; r += gridDim.x) {
    const uint8_t* in = reinterpret_cast<const uint8_t*>(ranges[r].addr);
    const uint64_t len = ranges[r].length;
    if (len <= xxh3::kMidSizeMax) {
      if (threadIdx.x == 0) out[r] = xxh3::Xxh3Short(in, len, kDeviceSecret);
      __syncthreads();
      continue;
    }
    if (threadIdx.x == 0) xxh3::InitAcc(acc);
    __syncthreads();
    const uint64_t blocks = (len - 1) / xxh3::kBlockLen;
    const unsigned lane = threadIdx.x % 8;
    const unsigned slot = threadIdx.x / 8;
    for (uint64_t first = 0; first < blocks; first += kBlocksPerRound) {
      const uint64_t b = first + slot;
      if (b < blocks) {
        contrib[slot][lane] = xxh3::Xxh3LaneBlockSum(in + b * xxh3::kBlockLen,
                                                     xxh3::kStripesPerBlock, lane, kDeviceSecret);
      }
      __syncthreads();
      if (threadIdx.x < 8) {
        const uint64_t n = blocks - first < kBlocksPerRound ? blocks - first : kBlocksPerRound;
        uint64_t a = acc[threadIdx.x];
        for (uint64_t k = 0; k < n; ++k) {
          a = xxh3::Xxh3ScrambleLane(a + contrib[k][threadIdx.x], threadIdx.x, kDeviceSecret);
        }
        acc[threadIdx.x] = a;
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      uint64_t a[8];
      for (int i = 0; i < 8; ++i) a[i] = acc[i];
      out[r] = xxh3::Xxh3LongFinish(a, in, len, kDeviceSecret);
    }
    __syncthreads();
  }
}

}  // namespace

int LaunchXxh3Kernel(const HashRange* ranges, uint64_t* out, uint32_t count, void* stream) {
  if (count == 0) return cudaSuccess;
  const unsigned grid = count < 65535u ? count : 65535u;
  Xxh3Kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(ranges, out, count);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace mc::transfer::cuda
