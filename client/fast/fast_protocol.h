// The fast channel's wire format (docs/architecture.md, "The fast channel"): Store calls over a
// Unix SOCK_SEQPACKET socket (<unix_socket>.fast), one datagram each way, carrying the same
// protobuf messages as the Store gRPC service. Shared by the daemon (fast_channel.h) and the C++
// client (fast_session.h). All integers little-endian.
//
//   request  "MCQ1", u32 method, u64 call_id, body (the serialized request message; ATTACH:
//            the fd session's owner token, or empty for the anonymous Unix caller)
//   reply    "MCR1", u32 gRPC status code, u64 call_id, u32 M, M bytes of error message, then
//            when OK the serialized response (ATTACH: u32 the daemon's max_message_bytes)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mc::client::fast {

inline constexpr char kRequestMagic[4] = {'M', 'C', 'Q', '1'};
inline constexpr char kReplyMagic[4] = {'M', 'C', 'R', '1'};
inline constexpr size_t kRequestHeaderSize = 16;
inline constexpr size_t kReplyHeaderSize = 20;  // before the error message
inline constexpr size_t kMaxTokenBytes = 128;
inline constexpr uint32_t kMinMessageBytes = 4096;
inline constexpr uint32_t kMaxMessageBytes = 4u << 20;

enum Method : uint32_t {
  kAttach = 1,
  kBatchPut = 2,
  kBatchGet = 3,
  kBatchExist = 4,
  kMatchPrefix = 5,
  kReleaseLease = 6,
  kBatchRemove = 7,
};
inline constexpr uint32_t kLastMethod = kBatchRemove;

// "ATTACH", "BatchPut", ...; "unknown" otherwise.
inline const char* MethodName(uint32_t method) {
  static constexpr const char* kNames[] = {"unknown",      "ATTACH",     "BatchPut",
                                           "BatchGet",     "BatchExist", "MatchPrefix",
                                           "ReleaseLease", "BatchRemove"};
  return method <= kLastMethod ? kNames[method] : kNames[0];
}

inline uint32_t LoadLe32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
inline uint64_t LoadLe64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
inline void StoreLe32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
inline void StoreLe64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// Writes the 16-byte request header at `p`.
inline void PutRequestHeader(char* p, uint32_t method, uint64_t call_id) {
  for (int i = 0; i < 4; ++i) p[i] = kRequestMagic[i];
  StoreLe32(p + 4, method);
  StoreLe64(p + 8, call_id);
}

// Writes the 20-byte reply header at `p` (the message follows it).
inline void PutReplyHeader(char* p, uint32_t code, uint64_t call_id, uint32_t message_bytes) {
  for (int i = 0; i < 4; ++i) p[i] = kReplyMagic[i];
  StoreLe32(p + 4, code);
  StoreLe64(p + 8, call_id);
  StoreLe32(p + 16, message_bytes);
}

// The fast socket next to a Store address "unix:PATH" (PATH.fast); "" for a TCP address.
inline std::string DefaultFastSocket(std::string_view store_address) {
  constexpr std::string_view kUnix = "unix:";
  if (store_address.substr(0, kUnix.size()) != kUnix) return "";
  return std::string(store_address.substr(kUnix.size())) + ".fast";
}

}  // namespace mc::client::fast
