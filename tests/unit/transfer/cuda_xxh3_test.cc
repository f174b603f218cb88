// The host/device XXH3-64 (transfer/cuda/xxh3_hd.h) against libxxhash through common/checksum:
// every length class (0, 1..3, 4..8, 9..16, 17..128, 129..240, > 240 with partial and whole
// 1 KiB blocks and many blocks), unaligned starts, and the decomposed block-contribution form
// the kernel uses. Runs everywhere (no CUDA needed); the kernel itself is compared with the
// CPU on a GPU by cuda_device_test (bench/gpu_check.sh).
#include <cstdint>
#include <random>
#include <vector>

#include "common/checksum.h"
#include "gtest/gtest.h"
#include "transfer/cuda/xxh3_hd.h"

namespace mc::transfer::cuda::xxh3 {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& c : b) c = static_cast<uint8_t>(rng());
  return b;
}

TEST(Xxh3Device, EqualsLibxxhashForEveryLengthUpTo4KiBAtEveryAlignment) {
  const std::vector<uint8_t> data = RandomBytes(4096 + 8, 1);
  for (size_t len = 0; len <= 4096; ++len) {
    for (size_t offset = 0; offset < 8; offset += (len < 300 ? 1 : 3)) {
      ASSERT_EQ(Xxh3_64(data.data() + offset, len, kHostSecret),
                Checksum(data.data() + offset, len))
          << "len " << len << " offset " << offset;
    }
  }
}

TEST(Xxh3Device, EqualsLibxxhashAtBlockAndStripeBoundaries) {
  const std::vector<uint8_t> data = RandomBytes((1 << 20) + 64, 2);
  for (size_t blocks : {1, 2, 3, 31, 32, 33, 64, 257, 1023}) {
    for (int64_t delta : {-65, -64, -63, -1, 0, 1, 63, 64, 65}) {
      const size_t len = blocks * kBlockLen + delta;
      for (size_t offset : {0, 1, 7, 13}) {
        ASSERT_EQ(Xxh3_64(data.data() + offset, len, kHostSecret),
                  Checksum(data.data() + offset, len))
            << "len " << len << " offset " << offset;
      }
    }
  }
}

TEST(Xxh3Device, EqualsLibxxhashForVllmBlockSizesAndLargeValues) {
  for (size_t len : {size_t{4} << 10, size_t{16} << 10, size_t{64} << 10, size_t{256} << 10,
                     size_t{4} << 20, (size_t{4} << 20) + 3}) {
    const std::vector<uint8_t> data = RandomBytes(len + 1, len);
    EXPECT_EQ(Xxh3_64(data.data(), len, kHostSecret), Checksum(data.data(), len)) << len;
    EXPECT_EQ(Xxh3_64(data.data() + 1, len, kHostSecret), Checksum(data.data() + 1, len)) << len;
  }
}

TEST(Xxh3Device, UniformBytesAndZerosMatch) {
  for (uint8_t fill : {0x00, 0xFF, 0x5A}) {
    const std::vector<uint8_t> data(10000, fill);
    for (size_t len : {0, 1, 16, 17, 128, 129, 240, 241, 1024, 1025, 10000}) {
      EXPECT_EQ(Xxh3_64(data.data(), len, kHostSecret), Checksum(data.data(), len))
          << "fill " << int(fill) << " len " << len;
    }
  }
}

// The kernel's schedule: contributions of blocks computed out of order (here: in reverse),
// then folded in order, must equal the sequential hash.
TEST(Xxh3Device, BlockContributionsComputedOutOfOrderFoldToTheSameHash) {
  const std::vector<uint8_t> data = RandomBytes(70 * kBlockLen + 77, 3);
  const uint64_t len = data.size();
  const uint64_t blocks = (len - 1) / kBlockLen;
  std::vector<uint64_t> contrib(blocks * 8);
  for (uint64_t b = blocks; b-- > 0;) {
    for (unsigned lane = 8; lane-- > 0;) {
      contrib[b * 8 + lane] =
          Xxh3LaneBlockSum(data.data() + b * kBlockLen, kStripesPerBlock, lane, kHostSecret);
    }
  }
  uint64_t acc[8];
  InitAcc(acc);
  for (uint64_t b = 0; b < blocks; ++b) {
    for (unsigned lane = 0; lane < 8; ++lane) {
      acc[lane] = Xxh3ScrambleLane(acc[lane] + contrib[b * 8 + lane], lane, kHostSecret);
    }
  }
  EXPECT_EQ(Xxh3LongFinish(acc, data.data(), len, kHostSecret), Checksum(data.data(), len));
}

}  // namespace
}  // namespace mc::transfer::cuda::xxh3
