// The on-disk record of the SSD tier.
//
//   [header block: fixed header (48 B) | key | zero padding to a 4 KiB multiple]
//   [payload | zero padding to a 4 KiB multiple]
//
// Fixed header, little-endian: magic u32, format version u16, flags u16 (0), header length u32
// (the whole header block), key length u32, generation u64, payload length u64, payload XXH3-64,
// header checksum (XXH3-64 of the whole header block with this field zero). A record thus
// carries its key, generation and checksum, so a reader rejects anything that is not exactly the
// record it asked for. Everything is 4 KiB-aligned for O_DIRECT. Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/keys.h"
#include "offload/extent_allocator.h"

namespace mc::offload {

inline constexpr uint32_t kRecordMagic = 0x3152434Du;  // "MCR1"
inline constexpr uint16_t kRecordFormatVersion = 1;
inline constexpr uint64_t kFixedHeaderSize = 48;
inline constexpr uint64_t kMaxRecordPayloadLength = uint64_t{1} << 40;  // 1 TiB

// Bytes of the header block of a record with a key of `key_len` bytes.
inline constexpr uint64_t HeaderBlockSize(uint64_t key_len) {
  return RoundUpToPage(kFixedHeaderSize + key_len);
}
// Bytes on disk of a whole record.
inline constexpr uint64_t RecordSize(uint64_t key_len, uint64_t payload_len) {
  return HeaderBlockSize(key_len) + RoundUpToPage(payload_len);
}

struct RecordHeader {
  uint64_t header_len = 0;  // == HeaderBlockSize(key.size())
  std::string key;
  uint64_t generation = 0;
  uint64_t payload_len = 0;
  uint64_t payload_checksum = 0;
};

// The header block (HeaderBlockSize(key.size()) bytes). kInvalidArgument when the key or the
// payload length exceeds the format's limits.
absl::StatusOr<std::string> EncodeHeader(std::string_view key, uint64_t generation,
                                         uint64_t payload_len, uint64_t payload_checksum);

// Writes the header block into `dst`, which must hold HeaderBlockSize(key.size()) bytes (e.g. the
// start of an aligned I/O buffer). Same errors as EncodeHeader.
absl::Status EncodeHeaderInto(std::string_view key, uint64_t generation, uint64_t payload_len,
                              uint64_t payload_checksum, char* dst);

// The header length a block claims, read from its first kFixedHeaderSize bytes without any
// verification (so a scanner knows how much to read); 0 when `bytes` is too short or the magic is
// wrong.
uint64_t PeekHeaderLength(std::string_view bytes);

// Parses and verifies a header block; `bytes` may extend past it. kChecksumMismatch for a bad
// magic, version, flags, header checksum, lengths out of range or inconsistent, or a block
// shorter than it claims.
absl::StatusOr<RecordHeader> DecodeHeader(std::string_view bytes);

}  // namespace mc::offload
