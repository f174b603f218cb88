// Launcher of the device XXH3-64 kernel (xxh3_kernel.cu, compiled by nvcc only with
// MC_WITH_CUDA). Plain C++ types so that cuda_api_cudart.cc and the GPU check need no nvcc.
#pragma once

#include <cstdint>

#include "transfer/cuda/hash_range.h"

namespace mc::transfer::cuda {

// Enqueues out[i] = XXH3-64(ranges[i]) for i < count on `stream` (a cudaStream_t). `ranges` and
// `out` must be device-accessible (pinned host or device memory). Returns the cudaError_t of
// the launch (0 = cudaSuccess).
int LaunchXxh3Kernel(const HashRange* ranges, uint64_t* out, uint32_t count, void* stream);

}  // namespace mc::transfer::cuda
