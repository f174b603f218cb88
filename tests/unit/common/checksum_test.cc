#include "common/checksum.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

// The reference: XXH3-64 compiled here, inline, in its portable scalar form. Whatever vector
// code common/checksum.cc runs (libxxhash's dispatcher: SSE2, AVX2 or AVX-512), the values must
// be these: they are recorded at put, stored in SSD records and compared across daemons.
#define XXH_INLINE_ALL
#define XXH_VECTOR 0  // XXH_SCALAR
#include <xxhash.h>

namespace mc {
namespace {

std::string Pattern(size_t size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string data(size, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  return data;
}

uint64_t Reference(const char* data, size_t size) { return XXH3_64bits(data, size); }

TEST(Checksum, StreamingEqualsOneShot) {
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31 + 7);
  StreamingChecksum s;
  s.Update(data.data(), 1);
  s.Update(data.data() + 1, 4095);
  s.Update(data.data() + 4096, data.size() - 4096);
  EXPECT_EQ(s.Digest(), Checksum(data));
}

TEST(Checksum, OneFlippedByteChangesIt) {
  std::string a(4096, 'x');
  std::string b = a;
  b[1234] ^= 1;
  EXPECT_NE(Checksum(a), Checksum(b));
}

TEST(Checksum, EmptyInputHasXxh3sKnownValue) {
  EXPECT_EQ(Checksum("", 0), 0x2D06800538D394C2ULL);
  StreamingChecksum s;
  EXPECT_EQ(s.Digest(), 0x2D06800538D394C2ULL);
}

// Every length XXH3 treats apart (0-16, 17-128, 129-240, then stripes of 64 bytes in blocks of
// 1,024), at every start alignment within a cache line, and a few large sizes.
TEST(Checksum, EqualsScalarReferenceForEveryShortLengthAndAlignment) {
  const std::string data = Pattern(4096 + 64, 1);
  for (size_t size = 0; size <= 2100; ++size) {
    for (size_t align : {size_t{0}, size_t{1}, size_t{7}, size_t{33}, size_t{63}}) {
      const char* p = data.data() + align;
      ASSERT_EQ(Checksum(p, size), Reference(p, size)) << "size " << size << " align " << align;
    }
  }
}

TEST(Checksum, EqualsScalarReferenceForLargeInputs) {
  const std::string data = Pattern((16 << 20) + 100, 2);
  for (size_t size : {size_t{4096}, size_t{65536}, size_t{(1 << 20) + 13}, size_t{16 << 20}}) {
    for (size_t align : {size_t{0}, size_t{5}}) {
      const char* p = data.data() + align;
      EXPECT_EQ(Checksum(p, size), Reference(p, size)) << "size " << size << " align " << align;
    }
  }
}

// Streaming, cut at seeded random points (pieces from 1 byte to 300 KiB, as the get and put paths
// feed it chunks and slices), equals the scalar one-shot value of the whole.
TEST(Checksum, StreamingInRandomPiecesEqualsScalarReference) {
  std::mt19937 rng(3);
  for (int round = 0; round < 40; ++round) {
    const size_t size = std::uniform_int_distribution<size_t>(0, 3 << 20)(rng);
    const std::string data = Pattern(size, 100 + round);
    StreamingChecksum s;
    size_t off = 0;
    while (off < size) {
      const size_t most = (round % 2 == 0) ? 300 : (300 << 10);
      size_t n = std::uniform_int_distribution<size_t>(1, most)(rng);
      n = std::min(n, size - off);
      s.Update(data.data() + off, n);
      off += n;
    }
    ASSERT_EQ(s.Digest(), Reference(data.data(), size)) << "round " << round << " size " << size;
  }
}

TEST(Checksum, NamesItsImplementation) {
  const std::string name = ChecksumImplementation();
  EXPECT_TRUE(name == "xxh3-dispatch" || name == "xxh3-baseline") << name;
}

}  // namespace
}  // namespace mc
