// One range of device memory to hash (XXH3-64, seed 0) on the device: the descriptor the XXH3
// kernel reads. Its own header so that nvcc compiles the kernel without Abseil.
#pragma once

#include <cstdint>

namespace mc::transfer::cuda {

struct HashRange {
  uint64_t addr;    // device address
  uint64_t length;  // bytes
};

}  // namespace mc::transfer::cuda
