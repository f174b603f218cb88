#include "offload/record_format.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "common/checksum.h"
#include "common/status.h"
#include "gtest/gtest.h"

namespace mc::offload {
namespace {

TEST(RecordFormat, SizesAre4KiBMultiples) {
  EXPECT_EQ(HeaderBlockSize(0), kPageSize);
  EXPECT_EQ(HeaderBlockSize(kPageSize - kFixedHeaderSize), kPageSize);
  EXPECT_EQ(HeaderBlockSize(kPageSize - kFixedHeaderSize + 1), 2 * kPageSize);
  EXPECT_EQ(HeaderBlockSize(kMaxKeyBytes), 2 * kPageSize);
  EXPECT_EQ(RecordSize(10, 0), kPageSize);
  EXPECT_EQ(RecordSize(10, 1), 2 * kPageSize);
  EXPECT_EQ(RecordSize(10, 8192), 3 * kPageSize);
}

TEST(RecordFormat, EncodeDecodeRoundTrip) {
  for (size_t key_len : {size_t{0}, size_t{1}, size_t{100}, size_t{4048}, size_t{4096}}) {
    std::string key(key_len, 'k');
    auto block = EncodeHeader(key, 77, 123456, 0xabcdef);
    ASSERT_TRUE(block.ok());
    EXPECT_EQ(block->size(), HeaderBlockSize(key_len));
    EXPECT_EQ(PeekHeaderLength(*block), block->size());
    auto h = DecodeHeader(*block);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->key, key);
    EXPECT_EQ(h->generation, 77u);
    EXPECT_EQ(h->payload_len, 123456u);
    EXPECT_EQ(h->payload_checksum, 0xabcdefu);
    EXPECT_EQ(h->header_len, block->size());
  }
}

TEST(RecordFormat, EncodeRejectsOutOfRangeInput) {
  EXPECT_EQ(ToCode(EncodeHeader(std::string(kMaxKeyBytes + 1, 'k'), 1, 1, 1).status()),
            Code::kInvalidArgument);
  EXPECT_EQ(ToCode(EncodeHeader("k", 1, kMaxRecordPayloadLength + 1, 1).status()),
            Code::kInvalidArgument);
}

void ExpectRejected(const std::string& block, std::string_view why) {
  auto h = DecodeHeader(block);
  ASSERT_FALSE(h.ok()) << why;
  EXPECT_EQ(ToCode(h.status()), Code::kChecksumMismatch) << why;
  EXPECT_NE(std::string(h.status().message()).find(why), std::string::npos) << h.status();
}

void SetU32(std::string& b, size_t off, uint32_t v) { std::memcpy(b.data() + off, &v, 4); }

TEST(RecordFormat, DecodeRejectsEachKindOfCorruption) {
  const std::string good = *EncodeHeader("my-key", 5, 4096, 99);
  std::string b = good;
  b[0] ^= 1;
  ExpectRejected(b, "bad magic");
  b = good;
  b[4] = 2;
  ExpectRejected(b, "unknown version");
  b = good;
  b[6] = 1;
  ExpectRejected(b, "unknown flags");
  b = good;
  SetU32(b, 12, kMaxKeyBytes + 1);
  ExpectRejected(b, "key length out of range");
  b = good;
  SetU32(b, 8, 2 * kPageSize);
  ExpectRejected(b, "header length inconsistent");
  b = good;
  b[20] ^= 1;  // generation
  ExpectRejected(b, "header checksum");
  b = good;
  b[48] ^= 1;  // key byte
  ExpectRejected(b, "header checksum");
  b = good;
  b[4000] = 1;  // padding is covered too
  ExpectRejected(b, "header checksum");
  ExpectRejected(good.substr(0, 100), "truncated");
  ExpectRejected(good.substr(0, 10), "shorter");
  // Payload length beyond the format limit with a recomputed (valid) header checksum: reject.
  std::string key(100, 'x');
  auto big = EncodeHeader(key, 1, kMaxRecordPayloadLength, 0);
  ASSERT_TRUE(big.ok());
  EXPECT_TRUE(DecodeHeader(*big).ok());
}

// The record fuzzer's seed corpus holds valid records (tests/fuzz/corpus/record_fuzz/valid_record,
// two_valid_records, written by an independent encoder: C with libxxhash), so the fuzzer starts
// from inputs that pass every check and mutates from there. They must stay decodable as the
// format evolves.
TEST(RecordFormat, FuzzSeedRecordsDecode) {
  for (const char* name : {"valid_record", "two_valid_records"}) {
    const std::string path = std::string(MC_SOURCE_DIR) + "/tests/fuzz/corpus/record_fuzz/" + name;
    std::FILE* f = std::fopen(path.c_str(), "rb");
    ASSERT_NE(f, nullptr) << path;
    std::string bytes(1 << 16, '\0');
    bytes.resize(std::fread(bytes.data(), 1, bytes.size(), f));
    std::fclose(f);
    auto header = DecodeHeader(bytes);
    ASSERT_TRUE(header.ok()) << name << ": " << header.status();
    EXPECT_GE(bytes.size(), RecordSize(header->key.size(), header->payload_len)) << name;
    const std::string_view payload(bytes.data() + header->header_len, header->payload_len);
    EXPECT_EQ(header->payload_checksum, Checksum(payload.data(), payload.size())) << name;
  }
}

}  // namespace
}  // namespace mc::offload
