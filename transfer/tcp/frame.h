// The tcp data-plane wire format (version 2): a fixed 48-byte little-endian header; requests
// of the data ops (READ, WRITE, READ_DISK) then carry a 64-byte capability block
// (common/capability.h: the master's grant for the object, or zeros where the owner runs
// without authentication); then a payload of `length` bytes, if any.
//
// INDEX requests (a writer tells a replica's owner which object it wrote where, for the owner's
// object index; transfer/index_notice.h) carry no capability block in the frame: each entry
// of the payload carries the WRITE capability of its own replica. segment_id, offset and
// reserved are 0; length = payload bytes (at most kMaxIndexNoticeBytes). Payload, little-endian:
//   u32 count (1..kMaxIndexNoticeEntries), then `count` entries of
//   u64 segment_id, u64 offset, u64 length, u64 generation, u64 checksum, u32 key_len
//   (1..kMaxKeyBytes, common/keys.h), key_len bytes of key, 64 bytes of capability (zeros without
//   auth).
// The payload must end exactly after the last entry. The response (no payload) is OK when every
// entry was recorded, else the code of the first refusal (PERMISSION_DENIED, NOT_FOUND for a
// segment the owner does not publish, INVALID_ARGUMENT; NOT_READY from an owner that keeps no
// object index).
//
//   offset size field
//        0    4 magic       kFrameMagic ("MCTF" read as little-endian u32)
//        4    2 version     kFrameVersion
//        6    2 op          FrameOp, | kResponseBit on responses
//        8    8 request_id  echoed by the response
//       16    8 segment_id
//       24    8 offset      byte offset inside the segment
//       32    8 length      request: READ bytes wanted / WRITE payload bytes that follow;
//                           response: payload bytes that follow (READ OK: the data; else 0)
//       40    4 code        mc::Code; 0 on requests
//       44    4 reserved    0, except in kReadDisk requests: the key tag (low 32 bits of XXH3)
//
// A connection carries requests in order and the server answers them in order. With a cluster
// secret, a connection's first exchange is the AUTH handshake (transfer/tcp/handshake.h); the
// server refuses every other op before it.
// DecodeFrameHeader() rejects anything malformed (magic, version, op, length above the limit,
// code on a request, unknown code on a response): a peer that sent it is not trusted further.
// Thread-safe: pure functions.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "common/status.h"

namespace mc::transfer::tcp {

inline constexpr uint32_t kFrameMagic = 0x4654434D;  // bytes "MCTF"
inline constexpr uint16_t kFrameVersion = 2;         // 2: capability block, AUTH op
inline constexpr size_t kFrameHeaderSize = 48;
inline constexpr uint64_t kDefaultMaxFrameLength = uint64_t{1} << 30;  // 1 GiB
inline constexpr uint16_t kResponseBit = 0x8000;

// Request ops. New ops extend this list and kMaxFrameOp; the 15 low bits leave room for them.
enum class FrameOp : uint16_t {
  kRead = 1,      // segment -> requester
  kWrite = 2,     // requester -> segment
  kReadDisk = 3,  // an SSD-tier record -> requester (served through RegisterOpHandler): segment_id
                  // = generation, offset = record locator, reserved = key tag
  kRdmaConnect = 4,  // rdma connection setup (transfer/rdma/handshake.h): payload = our queue
                     // pairs; response payload = the peer's queue pairs and segment rkeys
  kAuth = 5,         // the connection handshake (transfer/tcp/handshake.h); offset = its step
  kIndex = 6,        // index notice (served through RegisterOpHandler): payload = entries above
};
inline constexpr uint16_t kMaxFrameOp = 6;
// Bytes of the capability block after a data op's request header (auth::kCapabilitySize).
inline constexpr size_t kCapabilityBlockSize = 64;

// True for the request ops followed by a capability block (READ, WRITE, READ_DISK).
inline bool CarriesCapability(uint16_t base_op) {
  return base_op == static_cast<uint16_t>(FrameOp::kRead) ||
         base_op == static_cast<uint16_t>(FrameOp::kWrite) ||
         base_op == static_cast<uint16_t>(FrameOp::kReadDisk);
}

// True for the request ops whose payload travels requester -> server (WRITE, INDEX).
inline bool SendsPayload(uint16_t base_op) {
  return base_op == static_cast<uint16_t>(FrameOp::kWrite) ||
         base_op == static_cast<uint16_t>(FrameOp::kIndex);
}

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint16_t version = kFrameVersion;
  uint16_t op = 0;  // FrameOp value, | kResponseBit on responses
  uint64_t request_id = 0;
  uint64_t segment_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint32_t code = 0;  // mc::Code
  uint32_t reserved = 0;

  bool is_response() const { return (op & kResponseBit) != 0; }
  uint16_t base_op() const { return static_cast<uint16_t>(op & ~kResponseBit); }
};

using FrameBytes = std::array<uint8_t, kFrameHeaderSize>;

FrameBytes EncodeFrameHeader(const FrameHeader& header);
void EncodeFrameHeader(const FrameHeader& header, uint8_t* out);  // writes kFrameHeaderSize bytes

// Decodes and validates `size` bytes (must be kFrameHeaderSize). kInvalidArgument when malformed.
absl::StatusOr<FrameHeader> DecodeFrameHeader(const uint8_t* data, size_t size,
                                              uint64_t max_length = kDefaultMaxFrameLength);

// A request header for `op`.
FrameHeader MakeRequest(FrameOp op, uint64_t request_id, uint64_t segment_id, uint64_t offset,
                        uint64_t length);
// The response to `request` carrying `code` and `payload_length` bytes after it.
FrameHeader MakeResponse(const FrameHeader& request, Code code, uint64_t payload_length);

}  // namespace mc::transfer::tcp
