#include "proto/master_lane_frame.h"

#include <google/protobuf/message_lite.h>

#include <algorithm>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/byte_order.h"

namespace mc::lane {
namespace {

absl::Status Ended() { return absl::UnavailableError("the lane connection ended or stalled"); }

// A length-prefixed field of at most `max` bytes, read as its bytes arrive (at most 1 MiB is
// allocated ahead of the data).
absl::Status ReadField(const ReadExactly& read, size_t max, const char* what, std::string* out,
                       absl::StatusCode over) {
  char len_bytes[4];
  if (!read(len_bytes, sizeof(len_bytes))) return Ended();
  const uint32_t len = LoadLe<uint32_t>(len_bytes);
  if (len > max) {
    return absl::Status(over, absl::StrCat("lane ", what, " of ", len, " bytes exceeds ", max));
  }
  constexpr size_t kChunk = 1 << 20;
  out->clear();
  size_t have = 0;
  while (have < len) {
    const size_t n = std::min<size_t>(kChunk, len - have);
    out->resize(have + n);
    if (!read(out->data() + have, n)) return Ended();
    have += n;
  }
  return absl::OkStatus();
}

}  // namespace

std::string Greeting(GreetingStatus status, uint32_t idle_timeout_ms) {
  std::string out(kGreetingMagic);
  AppendLe<uint32_t>(out, status);
  AppendLe<uint32_t>(out, idle_timeout_ms);
  return out;
}

absl::StatusOr<uint32_t> ReadGreeting(const ReadExactly& read) {
  char g[kGreetingBytes];
  if (!read(g, sizeof(g))) return Ended();
  if (std::string_view(g, 4) != kGreetingMagic) {
    return absl::UnavailableError("the master lane sent no greeting");
  }
  const uint32_t status = LoadLe<uint32_t>(g + 4);
  if (status == kFull) return absl::UnavailableError("the master lane is full");
  if (status != kReady) return absl::UnavailableError("the master lane greeted with no status");
  return LoadLe<uint32_t>(g + 8);
}

absl::Status ReadRequest(const ReadExactly& read, size_t max_body_bytes, Request* out,
                         bool* idle_ok) {
  char head[20];
  if (idle_ok != nullptr) *idle_ok = false;
  if (!read(head, 1)) {
    if (idle_ok != nullptr) *idle_ok = true;
    return Ended();
  }
  if (!read(head + 1, sizeof(head) - 1)) return Ended();
  out->method = LoadLe<uint32_t>(head + 4);
  out->call_id = LoadLe<uint64_t>(head + 8);
  if (std::string_view(head, 4) != kRequestMagic) {
    return absl::InvalidArgumentError("not a lane request (bad magic)");
  }
  const uint32_t credential_bytes = LoadLe<uint32_t>(head + 16);
  if (credential_bytes > kMaxCredentialBytes) {
    return absl::InvalidArgumentError(absl::StrCat("lane credential of ", credential_bytes,
                                                   " bytes exceeds ", kMaxCredentialBytes));
  }
  out->credential.resize(credential_bytes);
  if (credential_bytes > 0 && !read(out->credential.data(), credential_bytes)) return Ended();
  return ReadField(read, max_body_bytes, "request body", &out->body,
                   absl::StatusCode::kResourceExhausted);
}

void AppendRequest(uint32_t method, uint64_t call_id, std::string_view credential,
                   const google::protobuf::MessageLite& body, std::string* out) {
  out->append(kRequestMagic);
  AppendLe<uint32_t>(*out, method);
  AppendLe<uint64_t>(*out, call_id);
  AppendLe<uint32_t>(*out, static_cast<uint32_t>(credential.size()));
  out->append(credential);
  const size_t n = body.ByteSizeLong();
  AppendLe<uint32_t>(*out, static_cast<uint32_t>(n));
  const size_t at = out->size();
  out->resize(at + n);
  body.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(out->data() + at));
}

absl::Status ReadReply(const ReadExactly& read, size_t max_body_bytes, Reply* out) {
  char head[16];
  if (!read(head, sizeof(head))) return Ended();
  if (std::string_view(head, 4) != kReplyMagic) {
    return absl::DataLossError("not a lane reply (bad magic)");
  }
  out->code = LoadLe<uint32_t>(head + 4);
  out->call_id = LoadLe<uint64_t>(head + 8);
  absl::Status s = ReadField(read, kMaxErrorMessageBytes, "reply message", &out->message,
                             absl::StatusCode::kDataLoss);
  if (s.ok()) {
    s = ReadField(read, kMaxLeaderBytes, "reply leader", &out->leader, absl::StatusCode::kDataLoss);
  }
  if (s.ok()) {
    s = ReadField(read, max_body_bytes, "reply body", &out->body, absl::StatusCode::kDataLoss);
  }
  return s;
}

void AppendReply(uint32_t code, uint64_t call_id, std::string_view message, std::string_view leader,
                 const google::protobuf::MessageLite* body, std::string* out) {
  out->append(kReplyMagic);
  AppendLe<uint32_t>(*out, code);
  AppendLe<uint64_t>(*out, call_id);
  message = message.substr(0, kMaxErrorMessageBytes);
  leader = leader.substr(0, kMaxLeaderBytes);
  AppendLe<uint32_t>(*out, static_cast<uint32_t>(message.size()));
  out->append(message);
  AppendLe<uint32_t>(*out, static_cast<uint32_t>(leader.size()));
  out->append(leader);
  if (code != 0 || body == nullptr) {
    AppendLe<uint32_t>(*out, 0);
    return;
  }
  const size_t n = body->ByteSizeLong();
  AppendLe<uint32_t>(*out, static_cast<uint32_t>(n));
  const size_t at = out->size();
  out->resize(at + n);
  body->SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(out->data() + at));
}

}  // namespace mc::lane
