#include "offload/record_format.h"

#include <cstring>

#include "common/byte_order.h"
#include "common/checksum.h"
#include "common/status.h"
#include "common/status_macros.h"

namespace mc::offload {
namespace {

constexpr size_t kOffMagic = 0, kOffVersion = 4, kOffFlags = 6, kOffHeaderLen = 8, kOffKeyLen = 12,
                 kOffGeneration = 16, kOffPayloadLen = 24, kOffPayloadSum = 32, kOffHeaderSum = 40;
static_assert(kOffHeaderSum + 8 == kFixedHeaderSize);

template <typename T>
void Put(char* dst, size_t off, T v) {
  StoreLe(dst + off, v);
}
template <typename T>
T Get(const char* src, size_t off) {
  return LoadLe<T>(src + off);
}

// XXH3 of the header block with the checksum field taken as zero.
uint64_t HeaderChecksum(const char* block, uint64_t header_len) {
  StreamingChecksum sum;
  static constexpr char kZero[8] = {};
  sum.Update(block, kOffHeaderSum);
  sum.Update(kZero, sizeof(kZero));
  sum.Update(block + kFixedHeaderSize, header_len - kFixedHeaderSize);
  return sum.Digest();
}

absl::Status Corrupt(std::string_view what) {
  return McError(Code::kChecksumMismatch, std::string("record header: ") + std::string(what));
}

}  // namespace

absl::Status EncodeHeaderInto(std::string_view key, uint64_t generation, uint64_t payload_len,
                              uint64_t payload_checksum, char* dst) {
  if (!key.empty()) MC_RETURN_IF_ERROR(ValidateKey(key));  // the format holds an empty key too
  if (payload_len > kMaxRecordPayloadLength) {
    return McError(Code::kInvalidArgument, "payload too large for the record format");
  }
  const uint64_t header_len = HeaderBlockSize(key.size());
  std::memset(dst, 0, header_len);
  Put<uint32_t>(dst, kOffMagic, kRecordMagic);
  Put<uint16_t>(dst, kOffVersion, kRecordFormatVersion);
  Put<uint16_t>(dst, kOffFlags, 0);
  Put<uint32_t>(dst, kOffHeaderLen, static_cast<uint32_t>(header_len));
  Put<uint32_t>(dst, kOffKeyLen, static_cast<uint32_t>(key.size()));
  Put<uint64_t>(dst, kOffGeneration, generation);
  Put<uint64_t>(dst, kOffPayloadLen, payload_len);
  Put<uint64_t>(dst, kOffPayloadSum, payload_checksum);
  if (!key.empty()) std::memcpy(dst + kFixedHeaderSize, key.data(), key.size());
  Put<uint64_t>(dst, kOffHeaderSum, HeaderChecksum(dst, header_len));
  return absl::OkStatus();
}

absl::StatusOr<std::string> EncodeHeader(std::string_view key, uint64_t generation,
                                         uint64_t payload_len, uint64_t payload_checksum) {
  if (!key.empty()) MC_RETURN_IF_ERROR(ValidateKey(key));  // the format holds an empty key too
  std::string block(HeaderBlockSize(key.size()), '\0');
  MC_RETURN_IF_ERROR(
      EncodeHeaderInto(key, generation, payload_len, payload_checksum, block.data()));
  return block;
}

uint64_t PeekHeaderLength(std::string_view bytes) {
  if (bytes.size() < kFixedHeaderSize) return 0;
  if (Get<uint32_t>(bytes.data(), kOffMagic) != kRecordMagic) return 0;
  return Get<uint32_t>(bytes.data(), kOffHeaderLen);
}

absl::StatusOr<RecordHeader> DecodeHeader(std::string_view bytes) {
  if (bytes.size() < kFixedHeaderSize) return Corrupt("shorter than the fixed header");
  const char* p = bytes.data();
  if (Get<uint32_t>(p, kOffMagic) != kRecordMagic) return Corrupt("bad magic");
  if (Get<uint16_t>(p, kOffVersion) != kRecordFormatVersion) return Corrupt("unknown version");
  if (Get<uint16_t>(p, kOffFlags) != 0) return Corrupt("unknown flags");
  const uint64_t header_len = Get<uint32_t>(p, kOffHeaderLen);
  const uint64_t key_len = Get<uint32_t>(p, kOffKeyLen);
  if (key_len > kMaxKeyBytes) return Corrupt("key length out of range");
  if (header_len != HeaderBlockSize(key_len)) return Corrupt("header length inconsistent");
  if (bytes.size() < header_len) return Corrupt("truncated header block");
  if (Get<uint64_t>(p, kOffHeaderSum) != HeaderChecksum(p, header_len)) {
    return Corrupt("header checksum mismatch");
  }
  RecordHeader h;
  h.payload_len = Get<uint64_t>(p, kOffPayloadLen);
  if (h.payload_len > kMaxRecordPayloadLength) return Corrupt("payload length out of range");
  h.header_len = header_len;
  h.key.assign(p + kFixedHeaderSize, key_len);
  h.generation = Get<uint64_t>(p, kOffGeneration);
  h.payload_checksum = Get<uint64_t>(p, kOffPayloadSum);
  return h;
}

}  // namespace mc::offload
