// The INDEX frame's payload: round trips, bounds on encode, and a decoder that refuses every
// truncated, oversized or garbled payload without crashing (seeded random mutations).
#include "transfer/index_notice.h"

#include <random>

#include "common/status.h"
#include "gtest/gtest.h"
#include "transfer/tcp/frame.h"

namespace mc::transfer {
namespace {

IndexNoticeEntry Entry(uint64_t i, size_t key_len = 10) {
  IndexNoticeEntry e{.segment_id = (uint64_t{7} << 32) | i,
                     .offset = 4096 * i,
                     .length = 1000 + i,
                     .generation = 50 + i,
                     .checksum = 0x1234567890abcdefULL ^ i,
                     .key = std::string(key_len, static_cast<char>('a' + i % 26))};
  for (size_t b = 0; b < e.capability.size(); ++b) e.capability[b] = static_cast<uint8_t>(b + i);
  return e;
}

absl::StatusOr<std::vector<IndexNoticeEntry>> Decode(const std::string& p) {
  return DecodeIndexNotice(reinterpret_cast<const uint8_t*>(p.data()), p.size());
}

TEST(IndexNotice, RoundTripsEveryField) {
  std::vector<IndexNoticeEntry> in = {Entry(1), Entry(2, 1), Entry(3, kMaxKeyBytes)};
  absl::StatusOr<std::string> payload = EncodeIndexNotice(in);
  ASSERT_TRUE(payload.ok()) << payload.status();
  size_t expect = 4;
  for (const auto& e : in) expect += IndexEntryBytes(e);
  EXPECT_EQ(payload->size(), expect);
  absl::StatusOr<std::vector<IndexNoticeEntry>> out = Decode(*payload);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ((*out)[i].segment_id, in[i].segment_id);
    EXPECT_EQ((*out)[i].offset, in[i].offset);
    EXPECT_EQ((*out)[i].length, in[i].length);
    EXPECT_EQ((*out)[i].generation, in[i].generation);
    EXPECT_EQ((*out)[i].checksum, in[i].checksum);
    EXPECT_EQ((*out)[i].key, in[i].key);
    EXPECT_EQ((*out)[i].capability, in[i].capability);
  }
}

TEST(IndexNotice, EncodeRefusesOutOfBounds) {
  EXPECT_EQ(ToCode(EncodeIndexNotice({}).status()), Code::kInvalidArgument);
  std::vector<IndexNoticeEntry> empty_key = {Entry(1, 0)};
  EXPECT_FALSE(EncodeIndexNotice(empty_key).ok());
  std::vector<IndexNoticeEntry> long_key = {Entry(1, kMaxKeyBytes + 1)};
  EXPECT_FALSE(EncodeIndexNotice(long_key).ok());
  std::vector<IndexNoticeEntry> many(kMaxIndexNoticeEntries + 1, Entry(1, 1));
  EXPECT_FALSE(EncodeIndexNotice(many).ok());
  // Within the entry count but above the byte bound.
  std::vector<IndexNoticeEntry> big(kMaxIndexNoticeBytes / kMaxKeyBytes + 1,
                                    Entry(1, kMaxKeyBytes));
  ASSERT_LE(big.size(), kMaxIndexNoticeEntries);
  EXPECT_FALSE(EncodeIndexNotice(big).ok());
}

TEST(IndexNotice, DecodeRefusesEveryTruncationAndTrailingBytes) {
  std::vector<IndexNoticeEntry> in = {Entry(1), Entry(2)};
  const std::string payload = *EncodeIndexNotice(in);
  for (size_t n = 0; n < payload.size(); ++n) {
    EXPECT_FALSE(Decode(payload.substr(0, n)).ok()) << "prefix of " << n << " bytes";
  }
  EXPECT_FALSE(Decode(payload + "x").ok());
  EXPECT_FALSE(DecodeIndexNotice(nullptr, 5).ok());
}

TEST(IndexNotice, DecodeRefusesHostileCountsAndKeyLengths) {
  std::string p = *EncodeIndexNotice(std::vector<IndexNoticeEntry>{Entry(1)});
  std::string zero = p;
  zero[0] = zero[1] = zero[2] = zero[3] = 0;  // count 0
  EXPECT_FALSE(Decode(zero).ok());
  std::string huge = p;
  huge[0] = huge[1] = huge[2] = huge[3] = '\xff';  // count 4G: refused before allocating
  EXPECT_FALSE(Decode(huge).ok());
  std::string two = p;
  two[0] = 2;  // claims two entries, holds one
  EXPECT_FALSE(Decode(two).ok());
  const size_t key_len_at = 4 + 5 * 8;
  std::string long_key = p;
  long_key[key_len_at] = '\xff';
  long_key[key_len_at + 1] = '\xff';
  long_key[key_len_at + 2] = '\xff';
  long_key[key_len_at + 3] = '\xff';
  EXPECT_FALSE(Decode(long_key).ok());
  std::string no_key = p;
  no_key[key_len_at] = 0;
  EXPECT_FALSE(Decode(no_key).ok());
  EXPECT_FALSE(Decode(std::string(kMaxIndexNoticeBytes + 1, '\x01')).ok());
}

TEST(IndexNotice, RandomMutationsNeverCrash) {
  std::vector<IndexNoticeEntry> in;
  for (uint64_t i = 0; i < 8; ++i) in.push_back(Entry(i, 1 + i * 7));
  const std::string payload = *EncodeIndexNotice(in);
  std::mt19937_64 rng(16);
  size_t decoded = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string p = payload;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) p[rng() % p.size()] = static_cast<char>(rng());
    if (rng() % 4 == 0) p.resize(rng() % (p.size() + 16), '\0');
    absl::StatusOr<std::vector<IndexNoticeEntry>> out = Decode(p);
    if (!out.ok()) continue;
    ++decoded;
    ASSERT_GE(out->size(), 1u);
    ASSERT_LE(out->size(), kMaxIndexNoticeEntries);
    size_t bytes = 4;
    for (const auto& e : *out) {
      ASSERT_GE(e.key.size(), 1u);
      ASSERT_LE(e.key.size(), kMaxKeyBytes);
      bytes += IndexEntryBytes(e);
    }
    ASSERT_EQ(bytes, p.size()) << "a decoded payload is exactly its entries";
  }
  // Flips inside values keep the payload well-formed, so some decode.
  EXPECT_GT(decoded, 0u);
  // Pure noise.
  for (int round = 0; round < 2000; ++round) {
    std::string p(rng() % 512, '\0');
    for (char& c : p) c = static_cast<char>(rng());
    (void)Decode(p);
  }
}

TEST(IndexNotice, FrameOpIsAcceptedAndCarriesNoCapabilityBlock) {
  tcp::FrameHeader h = tcp::MakeRequest(tcp::FrameOp::kIndex, 1, 0, 0, 100);
  tcp::FrameBytes bytes = tcp::EncodeFrameHeader(h);
  absl::StatusOr<tcp::FrameHeader> back = tcp::DecodeFrameHeader(bytes.data(), bytes.size());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->base_op(), static_cast<uint16_t>(tcp::FrameOp::kIndex));
  EXPECT_FALSE(tcp::CarriesCapability(back->base_op()));
  EXPECT_TRUE(tcp::SendsPayload(back->base_op()));
}

}  // namespace
}  // namespace mc::transfer
