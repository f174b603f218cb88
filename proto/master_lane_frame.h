// The master lane's wire format (docs/architecture.md, "The master lane"): the mc-client daemon's
// hot master calls (GetReplicas, ReleaseLeases, PutStart, PutEnd, PutRevoke, Exist, Remove) as
// one request frame and one reply frame on a plain TCP connection, without gRPC's HTTP/2 framing
// and thread hand-offs. Integers are little-endian.
//   greeting: "MCG1", u32 status (0 = ready, 1 = full), u32 the master's idle timeout in ms.
//            The master writes it on every accepted connection before reading anything; when
//            full it writes "full" and closes. The daemon reads it right after connect and sends
//            nothing on a connection that did not greet "ready": a full or stopping master
//            never loses a request it did not read.
//   request: "MCL1", u32 method, u64 call_id, u32 credential length (<= 128) + credential (the
//            x-mc-session value; empty without authentication), u32 body length + body (the
//            serialized protobuf request).
//   reply:   "MCM1", u32 gRPC status code, u64 call_id (the request's), u32 + error message,
//            u32 + leader address (a standby's refusal), u32 + body (the serialized response;
//            empty unless the code is OK).
// This header holds the encoding and the bounded readers both ends use; it knows no sockets.
// Every length is checked against its bound before anything is allocated for it, and a body is
// read in chunks as its bytes arrive, so a frame that announces much and sends little costs
// little. Thread-compatible (plain functions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace google::protobuf {
class MessageLite;
}

namespace mc::lane {

inline constexpr std::string_view kRequestMagic = "MCL1";
inline constexpr std::string_view kReplyMagic = "MCM1";
inline constexpr size_t kMaxCredentialBytes = 128;
inline constexpr size_t kMaxErrorMessageBytes = 4096;  // longer messages are cut
inline constexpr size_t kMaxLeaderBytes = 1024;
inline constexpr std::string_view kGreetingMagic = "MCG1";
inline constexpr size_t kGreetingBytes = 12;

// The method numbers: the Master service's RPCs in master.proto's order (1 = Hello). The lane
// serves only the seven hot calls; every other number is answered UNIMPLEMENTED (a master before
// ReleaseLeases joined the lane answers 9 so too: the daemon then sends releases over gRPC).
enum Method : uint32_t {
  kRegisterClient = 2,
  kPutStart = 5,
  kPutEnd = 6,
  kPutRevoke = 7,
  kGetReplicas = 8,
  kReleaseLeases = 9,
  kExist = 10,
  kRemove = 11,
};

// Reads exactly `n` bytes into `dst`; false on EOF, timeout or error (nothing more can be read).
using ReadExactly = std::function<bool(char* dst, size_t n)>;

struct Request {
  uint32_t method = 0;
  uint64_t call_id = 0;
  std::string credential;
  std::string body;
};

enum GreetingStatus : uint32_t { kReady = 0, kFull = 1 };

// The greeting the master writes on an accepted connection (kGreetingBytes long).
std::string Greeting(GreetingStatus status, uint32_t idle_timeout_ms);

// Reads the greeting: OK with the master's idle timeout (ms) when it is "ready"; kUnavailable
// when it is "full", the stream ended or stalled, or the bytes are no greeting.
absl::StatusOr<uint32_t> ReadGreeting(const ReadExactly& read);

// Reads one request frame. OK: `*out` holds it. kUnavailable: the stream ended or stalled
// (before or inside the frame): close without an answer. Any other code (bad magic, a
// credential or body over its bound): the frame is malformed; answer it (out->call_id is set
// once the fixed head was read) and close, as the stream cannot be resynchronized.
// `idle_ok`: set true when the stream ended cleanly before the frame's first byte.
absl::Status ReadRequest(const ReadExactly& read, size_t max_body_bytes, Request* out,
                         bool* idle_ok = nullptr);

// Appends a request frame to `out`.
void AppendRequest(uint32_t method, uint64_t call_id, std::string_view credential,
                   const google::protobuf::MessageLite& body, std::string* out);

struct Reply {
  uint32_t code = 0;  // grpc::StatusCode
  uint64_t call_id = 0;
  std::string message;
  std::string leader;
  std::string body;
};

// Reads one reply frame: OK, kUnavailable (the stream ended or stalled), or kDataLoss (a
// malformed reply: bad magic, lengths over their bounds).
absl::Status ReadReply(const ReadExactly& read, size_t max_body_bytes, Reply* out);

// Appends a reply frame to `out`; `body` (may be null) is serialized only when `code` is 0.
void AppendReply(uint32_t code, uint64_t call_id, std::string_view message, std::string_view leader,
                 const google::protobuf::MessageLite* body, std::string* out);

// Both ends keep a connection's frame buffers between calls, so that a call allocates nothing for
// them once the connection has served one of its size; a buffer a large call grew past
// kKeepBufferBytes is freed after that call.
inline constexpr size_t kKeepBufferBytes = 1 << 20;
inline void TrimBuffer(std::string& buffer) {
  if (buffer.capacity() > kKeepBufferBytes) std::string().swap(buffer);
}

}  // namespace mc::lane
