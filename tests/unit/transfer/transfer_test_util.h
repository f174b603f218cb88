// Helpers shared by the transfer tests: deterministic byte patterns and request builders.
#pragma once

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "transfer/transfer_engine.h"

namespace mc::transfer::testing {

// Deterministic pseudo-random bytes for `seed`.
inline std::vector<char> Pattern(uint64_t size, uint64_t seed) {
  std::vector<char> out(size);
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    const uint64_t v = rng();
    for (int k = 0; k < 8; ++k) out[i + k] = static_cast<char>(v >> (8 * k));
  }
  for (; i < size; ++i) out[i] = static_cast<char>(rng());
  return out;
}

// Splits `buf` into `pieces` consecutive LocalBuffers (the last takes the remainder).
inline std::vector<LocalBuffer> Split(std::vector<char>& buf, int pieces) {
  std::vector<LocalBuffer> out;
  const uint64_t step = buf.size() / pieces;
  uint64_t pos = 0;
  for (int i = 0; i < pieces; ++i) {
    const uint64_t n = i + 1 == pieces ? buf.size() - pos : step;
    out.push_back({buf.data() + pos, n});
    pos += n;
  }
  return out;
}

inline TransferRequest Request(Direction op, std::vector<LocalBuffer> local, std::string endpoint,
                               uint64_t segment, uint64_t offset) {
  return TransferRequest{op, std::move(local), std::move(endpoint), SegmentRange{segment, offset}};
}

inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace mc::transfer::testing
