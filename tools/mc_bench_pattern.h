// The payload mc-bench writes and expects back: the value of key id K is a sequence of 64-bit
// words, word i = Seed(K) + i * kStride (little-endian; a tail shorter than a word holds the low
// bytes of the next word). Every key and every offset differ, so a get that returns another
// key's bytes, shifted bytes or stale bytes is caught without keeping a copy of the payload.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <cstring>

namespace mc::bench {

inline constexpr uint64_t kStride = 0xD6E8FEB86659FD93ull;

inline uint64_t Seed(uint64_t key_id) { return (key_id + 1) * 0x9E3779B97F4A7C15ull; }

inline void FillPattern(char* dst, uint64_t size, uint64_t key_id) {
  const uint64_t seed = Seed(key_id);
  const uint64_t words = size / 8;
  for (uint64_t i = 0; i < words; ++i) {
    uint64_t w = seed + i * kStride;
    std::memcpy(dst + i * 8, &w, 8);
  }
  if (size % 8 != 0) {
    uint64_t w = seed + words * kStride;
    std::memcpy(dst + words * 8, &w, size % 8);
  }
}

// True when `src` holds exactly the value of `key_id`.
inline bool CheckPattern(const char* src, uint64_t size, uint64_t key_id) {
  const uint64_t seed = Seed(key_id);
  const uint64_t words = size / 8;
  uint64_t bad = 0;
  for (uint64_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, src + i * 8, 8);
    bad |= w ^ (seed + i * kStride);  // branch-free so the loop vectorizes
  }
  if (bad != 0) return false;
  if (size % 8 != 0) {
    uint64_t w = seed + words * kStride;
    return std::memcmp(src + words * 8, &w, size % 8) == 0;
  }
  return true;
}

// Overwrites one word per 4 KiB page and the last word, so a destination the daemon claims to
// have written but did not (fully) fails CheckPattern. Cheap next to a full memset.
inline void PoisonPages(char* dst, uint64_t size) {
  const uint64_t poison = 0xDEADBEEFDEADBEEFull;
  for (uint64_t off = 0; off + 8 <= size; off += 4096) std::memcpy(dst + off, &poison, 8);
  if (size >= 8) std::memcpy(dst + size - 8, &poison, 8);
}

}  // namespace mc::bench
