// XXH3-64 (seed 0, default secret) written once for the host and the device: the same functions
// run in the CUDA checksum kernel (transfer/cuda/xxh3_kernel.cu) and, on the CPU, in the unit
// test that compares them with libxxhash (common/checksum.h) for every length class. Only the
// seed-0 one-shot hash that mcstore records at put is provided; it is bit-identical to
// XXH3_64bits() of xxHash 0.8.
//
// The long-input path (> 240 bytes) is written in the decomposed form the kernel needs: between
// two scrambles the eight accumulators only receive additions, so the contribution of each
// 1 KiB block (16 stripes) to each lane can be computed independently (in parallel on the GPU)
// and then folded in order: acc = scramble(acc + contribution[block]). Xxh3Long() below is that
// fold done sequentially; the kernel does the same fold after computing contributions in
// parallel. Both call Xxh3LaneBlockSum/Xxh3Scramble/Xxh3LongFinish, so the CPU test covers the
// arithmetic the kernel runs; only the kernel's scheduling is left to the GPU test.
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define MC_HD __host__ __device__ __forceinline__
#else
#define MC_HD inline
#endif

// The 192-byte default secret of XXH3 (XXH3_kSecret in xxhash.h). A macro so that the host
// array and the kernel's __constant__ copy come from the one initializer.
#define MC_XXH3_SECRET_BYTES                                                                      \
  {                                                                                               \
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad,     \
        0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, \
        0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, \
        0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, \
        0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, \
        0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, \
        0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, \
        0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, \
        0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, \
        0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, \
        0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, \
        0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f, \
        0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e                    \
  }

namespace mc::transfer::cuda::xxh3 {

inline constexpr uint64_t kSecretSize = 192;
inline constexpr uint64_t kStripeLen = 64;
inline constexpr uint64_t kStripesPerBlock = (kSecretSize - kStripeLen) / 8;  // 16
inline constexpr uint64_t kBlockLen = kStripeLen * kStripesPerBlock;          // 1024
inline constexpr uint64_t kMidSizeMax = 240;
// The secret for host callers; device code uses the kernel's __constant__ copy.
inline constexpr uint8_t kHostSecret[kSecretSize] = MC_XXH3_SECRET_BYTES;

inline constexpr uint64_t kPrime32_1 = 0x9E3779B1U;
inline constexpr uint64_t kPrime32_2 = 0x85EBCA77U;
inline constexpr uint64_t kPrime32_3 = 0xC2B2AE3DU;
inline constexpr uint64_t kPrime64_1 = 0x9E3779B185EBCA87ULL;
inline constexpr uint64_t kPrime64_2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr uint64_t kPrime64_3 = 0x165667B19E3779F9ULL;
inline constexpr uint64_t kPrime64_4 = 0x85EBCA77C2B2AE63ULL;
inline constexpr uint64_t kPrime64_5 = 0x27D4EB2F165667C5ULL;
inline constexpr uint64_t kPrimeMx1 = 0x165667919E3779F9ULL;
inline constexpr uint64_t kPrimeMx2 = 0x9FB21C651E98DF25ULL;

// Little-endian loads from any alignment (both targets are little-endian).
MC_HD uint64_t Read64(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) return *reinterpret_cast<const uint64_t*>(p);
#endif
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
MC_HD uint32_t Read32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
MC_HD uint64_t Rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
MC_HD uint64_t Swap64(uint64_t x) {
  x = ((x & 0x00FF00FF00FF00FFULL) << 8) | ((x >> 8) & 0x00FF00FF00FF00FFULL);
  x = ((x & 0x0000FFFF0000FFFFULL) << 16) | ((x >> 16) & 0x0000FFFF0000FFFFULL);
  return (x << 32) | (x >> 32);
}
// Low 64 bits xor high 64 bits of the 128-bit product.
MC_HD uint64_t Mul128Fold64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return (a * b) ^ __umul64hi(a, b);
#else
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
#endif
}
MC_HD uint64_t Xxh64Avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kPrime64_2;
  h ^= h >> 29;
  h *= kPrime64_3;
  return h ^ (h >> 32);
}
MC_HD uint64_t Avalanche(uint64_t h) {
  h ^= h >> 37;
  h *= kPrimeMx1;
  return h ^ (h >> 32);
}
MC_HD uint64_t Rrmxmx(uint64_t h, uint64_t len) {
  h ^= Rotl64(h, 49) ^ Rotl64(h, 24);
  h *= kPrimeMx2;
  h ^= (h >> 35) + len;
  h *= kPrimeMx2;
  return h ^ (h >> 28);
}
MC_HD uint64_t Mix16B(const uint8_t* in, const uint8_t* secret) {
  return Mul128Fold64(Read64(in) ^ Read64(secret), Read64(in + 8) ^ Read64(secret + 8));
}

// Inputs of 0..240 bytes (seed 0).
MC_HD uint64_t Xxh3Short(const uint8_t* in, uint64_t len, const uint8_t* secret) {
  if (len <= 16) {
    if (len > 8) {
      const uint64_t lo = Read64(in) ^ (Read64(secret + 24) ^ Read64(secret + 32));
      const uint64_t hi = Read64(in + len - 8) ^ (Read64(secret + 40) ^ Read64(secret + 48));
      return Avalanche(len + Swap64(lo) + hi + Mul128Fold64(lo, hi));
    }
    if (len >= 4) {
      const uint64_t in1 = Read32(in);
      const uint64_t in2 = Read32(in + len - 4);
      const uint64_t keyed = (in2 + (in1 << 32)) ^ (Read64(secret + 8) ^ Read64(secret + 16));
      return Rrmxmx(keyed, len);
    }
    if (len > 0) {
      const uint32_t combined =
          (static_cast<uint32_t>(in[0]) << 16) | (static_cast<uint32_t>(in[len >> 1]) << 24) |
          static_cast<uint32_t>(in[len - 1]) | (static_cast<uint32_t>(len) << 8);
      const uint64_t bitflip = Read32(secret) ^ Read32(secret + 4);
      return Xxh64Avalanche(static_cast<uint64_t>(combined) ^ bitflip);
    }
    return Xxh64Avalanche(Read64(secret + 56) ^ Read64(secret + 64));
  }
  uint64_t acc = len * kPrime64_1;
  if (len <= 128) {
    if (len > 32) {
      if (len > 64) {
        if (len > 96) {
          acc += Mix16B(in + 48, secret + 96);
          acc += Mix16B(in + len - 64, secret + 112);
        }
        acc += Mix16B(in + 32, secret + 64);
        acc += Mix16B(in + len - 48, secret + 80);
      }
      acc += Mix16B(in + 16, secret + 32);
      acc += Mix16B(in + len - 32, secret + 48);
    }
    acc += Mix16B(in, secret);
    acc += Mix16B(in + len - 16, secret + 16);
    return Avalanche(acc);
  }
  // 129..240
  const uint64_t rounds = len / 16;
  for (uint64_t i = 0; i < 8; ++i) acc += Mix16B(in + 16 * i, secret + 16 * i);
  acc = Avalanche(acc);
  for (uint64_t i = 8; i < rounds; ++i) acc += Mix16B(in + 16 * i, secret + 16 * (i - 8) + 3);
  acc += Mix16B(in + len - 16, secret + 136 - 17);
  return Avalanche(acc);
}

// The initial accumulators of the long path.
MC_HD void InitAcc(uint64_t acc[8]) {
  acc[0] = kPrime32_3;
  acc[1] = kPrime64_1;
  acc[2] = kPrime64_2;
  acc[3] = kPrime64_3;
  acc[4] = kPrime64_4;
  acc[5] = kPrime32_2;
  acc[6] = kPrime64_5;
  acc[7] = kPrime32_1;
}

// What `nstripes` consecutive stripes starting at `stripes` (stripe n keyed with secret + 8n)
// add to accumulator `lane` (0..7): per stripe, the input word of lane^1 plus the 32x32 product
// of the keyed word of `lane`.
MC_HD uint64_t Xxh3LaneBlockSum(const uint8_t* stripes, uint64_t nstripes, unsigned lane,
                                const uint8_t* secret) {
  uint64_t sum = 0;
  for (uint64_t n = 0; n < nstripes; ++n) {
    const uint8_t* s = stripes + n * kStripeLen;
    const uint64_t key = Read64(s + 8 * lane) ^ Read64(secret + 8 * n + 8 * lane);
    sum += Read64(s + 8 * (lane ^ 1)) + (key & 0xFFFFFFFFULL) * (key >> 32);
  }
  return sum;
}

// One lane of the scramble that ends each full block.
MC_HD uint64_t Xxh3ScrambleLane(uint64_t acc, unsigned lane, const uint8_t* secret) {
  acc ^= acc >> 47;
  acc ^= Read64(secret + kSecretSize - kStripeLen + 8 * lane);
  return acc * kPrime32_1;
}

// The tail of the long path: `acc` has absorbed every full block (len > 240, so there is at
// least one stripe after them); adds the partial last block and the last stripe and merges.
MC_HD uint64_t Xxh3LongFinish(uint64_t acc[8], const uint8_t* in, uint64_t len,
                              const uint8_t* secret) {
  const uint64_t blocks = (len - 1) / kBlockLen;
  const uint64_t tail_stripes = ((len - 1) - kBlockLen * blocks) / kStripeLen;
  const uint8_t* tail = in + blocks * kBlockLen;
  for (unsigned lane = 0; lane < 8; ++lane) {
    acc[lane] += Xxh3LaneBlockSum(tail, tail_stripes, lane, secret);
  }
  // The last stripe (overlapping the previous ones), keyed at secret + 192 - 64 - 7.
  const uint8_t* last = in + len - kStripeLen;
  const uint8_t* last_secret = secret + kSecretSize - kStripeLen - 7;
  uint64_t add[8];
  for (unsigned lane = 0; lane < 8; ++lane) {
    const uint64_t key = Read64(last + 8 * lane) ^ Read64(last_secret + 8 * lane);
    add[lane] = Read64(last + 8 * (lane ^ 1)) + (key & 0xFFFFFFFFULL) * (key >> 32);
  }
  for (unsigned lane = 0; lane < 8; ++lane) acc[lane] += add[lane];
  uint64_t result = len * kPrime64_1;
  for (unsigned i = 0; i < 4; ++i) {
    result += Mul128Fold64(acc[2 * i] ^ Read64(secret + 11 + 16 * i),
                           acc[2 * i + 1] ^ Read64(secret + 11 + 16 * i + 8));
  }
  return Avalanche(result);
}

// Inputs over 240 bytes, folded sequentially (the kernel computes the block sums in parallel).
MC_HD uint64_t Xxh3Long(const uint8_t* in, uint64_t len, const uint8_t* secret) {
  uint64_t acc[8];
  InitAcc(acc);
  const uint64_t blocks = (len - 1) / kBlockLen;
  for (uint64_t b = 0; b < blocks; ++b) {
    for (unsigned lane = 0; lane < 8; ++lane) {
      acc[lane] = Xxh3ScrambleLane(
          acc[lane] + Xxh3LaneBlockSum(in + b * kBlockLen, kStripesPerBlock, lane, secret), lane,
          secret);
    }
  }
  return Xxh3LongFinish(acc, in, len, secret);
}

MC_HD uint64_t Xxh3_64(const uint8_t* in, uint64_t len, const uint8_t* secret) {
  return len <= kMidSizeMax ? Xxh3Short(in, len, secret) : Xxh3Long(in, len, secret);
}

}  // namespace mc::transfer::cuda::xxh3
