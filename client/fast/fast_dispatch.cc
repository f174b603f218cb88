#include "client/fast/fast_dispatch.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mc::client {

namespace sv1 = mcstore::v1;
using fast::kReplyHeaderSize;
using fast::kRequestHeaderSize;

namespace {

constexpr uint32_t kOk = 0;
constexpr uint32_t kInvalidArgument = 3;
constexpr uint32_t kResourceExhausted = 8;
constexpr uint32_t kFailedPrecondition = 9;
constexpr uint32_t kUnauthenticated = 16;

std::string CodeName(uint32_t code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// A token is printable ASCII (the fd channel hands out 32 hex digits).
bool PrintableAscii(const char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] < 0x21 || p[i] > 0x7e) return false;
  }
  return true;
}

// An answer over the limit keeps every item's code: the items' messages are cut (on a UTF-8
// boundary, marked "...") to 256, 128 ... 16 bytes until the answer fits, so a put or remove
// that was applied is answered as such rather than refused after the fact. Returns the
// answer's size after the cuts (still over the limit when its data, not its messages, is big).
template <typename Resp>
size_t CutMessagesToFit(Resp* resp, size_t size, size_t limit) {
  if constexpr (requires { resp->mutable_results(); }) {
    for (size_t cap = 256; size > limit && cap >= 16; cap /= 2) {
      for (auto& result : *resp->mutable_results()) {
        std::string* message = result.mutable_message();
        if (message->size() <= cap) continue;
        size_t cut = cap - 3;
        while (cut > 0 && (static_cast<unsigned char>((*message)[cut]) & 0xC0) == 0x80) --cut;
        message->resize(cut);
        message->append("...");
      }
      size = resp->ByteSizeLong();
    }
  }
  return size;
}

}  // namespace

FastDispatcher::FastDispatcher(FastStoreCalls& calls, const CallerSessions* sessions,
                               uint32_t max_message_bytes, MetricsRegistry& metrics)
    : calls_(calls), sessions_(sessions), max_message_bytes_(max_message_bytes), metrics_(metrics) {
  for (uint32_t m = 1; m <= fast::kLastMethod; ++m) {
    ok_calls_[m] = &metrics_.GetCounter("mc_store_fast_calls_total",
                                        "Calls served on the fast channel, by method and code",
                                        {{"method", fast::MethodName(m)}, {"code", "OK"}});
  }
}

void FastDispatcher::CountRefused(const char* reason) {
  metrics_
      .GetCounter("mc_store_fast_refused_total",
                  "Connections and datagrams the fast channel refused (and closed), by reason",
                  {{"reason", reason}})
      .Inc();
}

void FastDispatcher::CountCall(uint32_t method, uint32_t code) {
  if (code == kOk && method <= fast::kLastMethod) {
    ok_calls_[method]->Inc();
    return;
  }
  metrics_
      .GetCounter("mc_store_fast_calls_total",
                  "Calls served on the fast channel, by method and code",
                  {{"method", fast::MethodName(method)}, {"code", CodeName(code)}})
      .Inc();
}

void FastDispatcher::WriteHeader(uint32_t code, uint64_t call_id, std::string_view message,
                                 std::string* reply) {
  // The limit is at least 4096 bytes: an error message is cut to what fits.
  message = message.substr(0, max_message_bytes_ - kReplyHeaderSize);
  reply->resize(kReplyHeaderSize);
  fast::PutReplyHeader(reply->data(), code, call_id, static_cast<uint32_t>(message.size()));
  reply->append(message.data(), message.size());
}

bool FastDispatcher::Attach(FastConnection& conn, uint64_t call_id, const char* body, size_t size,
                            std::string* reply) {
  if (conn.attached) {
    CountCall(fast::kAttach, kFailedPrecondition);
    WriteHeader(kFailedPrecondition, call_id, "this connection is already attached", reply);
    return true;
  }
  std::string refusal;
  if (size > fast::kMaxTokenBytes || !PrintableAscii(body, size)) {
    refusal = absl::StrCat("the owner token is not at most ", fast::kMaxTokenBytes,
                           " printable ASCII characters");
  } else if (size > 0) {
    const std::string_view token(body, size);
    std::optional<uid_t> uid = sessions_ != nullptr ? sessions_->UidOf(token) : std::nullopt;
    if (!uid.has_value()) {
      refusal = absl::StrCat(std::string(StoreAuth::kSessionLost),
                             " the owner token names no live fd session of this mc-client (it "
                             "restarted, or the session was closed): open a new fd session");
    } else if (*uid != conn.peer_uid) {
      refusal = "the owner token's fd session belongs to another uid than this connection's";
    }
  }
  if (!refusal.empty()) {
    CountCall(fast::kAttach, kUnauthenticated);
    CountRefused("attach");
    WriteHeader(kUnauthenticated, call_id, refusal, reply);
    return false;
  }
  conn.attached = true;
  conn.caller.token.assign(body, size);
  CountCall(fast::kAttach, kOk);
  WriteHeader(kOk, call_id, "", reply);
  reply->resize(kReplyHeaderSize + 4);
  fast::StoreLe32(reply->data() + kReplyHeaderSize, max_message_bytes_);
  return true;
}

template <typename Req, typename Resp>
void FastDispatcher::Call(grpc::Status (FastStoreCalls::*fn)(const FastCaller&, const Req*, Resp*),
                          FastConnection& conn, uint32_t method, uint64_t call_id, const char* body,
                          size_t size, std::string* reply, google::protobuf::Arena* arena) {
  Req* req = google::protobuf::Arena::CreateMessage<Req>(arena);
  if (!req->ParseFromArray(body, static_cast<int>(size))) {
    CountCall(method, kInvalidArgument);
    WriteHeader(kInvalidArgument, call_id,
                absl::StrCat("the body does not parse as a ", Req::descriptor()->name()), reply);
    return;
  }
  Resp* resp = google::protobuf::Arena::CreateMessage<Resp>(arena);
  const grpc::Status status = (calls_.*fn)(conn.caller, req, resp);
  const auto code = static_cast<uint32_t>(status.error_code());
  if (code != kOk) {
    CountCall(method, code);
    WriteHeader(code, call_id, status.error_message(), reply);
    return;
  }
  const size_t limit = max_message_bytes_ - kReplyHeaderSize;
  const size_t body_bytes = CutMessagesToFit(resp, resp->ByteSizeLong(), limit);
  if (body_bytes > limit) {
    CountCall(method, kResourceExhausted);
    WriteHeader(kResourceExhausted, call_id,
                absl::StrCat("answer of ", body_bytes + kReplyHeaderSize,
                             " bytes exceeds the fast channel's limit of ", max_message_bytes_,
                             " bytes; use the gRPC Store service"),
                reply);
    return;
  }
  CountCall(method, kOk);
  WriteHeader(kOk, call_id, "", reply);
  reply->resize(kReplyHeaderSize + body_bytes);
  resp->SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(reply->data()) +
                                        kReplyHeaderSize);
}

bool FastDispatcher::Handle(FastConnection& conn, const char* data, size_t size, std::string* reply,
                            google::protobuf::Arena* arena) {
  if (size > max_message_bytes_) {
    CountRefused("oversize");
    const uint64_t call_id = size >= kRequestHeaderSize ? fast::LoadLe64(data + 8) : 0;
    WriteHeader(kInvalidArgument, call_id,
                absl::StrCat("a datagram of ", size, " bytes exceeds the fast channel's limit of ",
                             max_message_bytes_, " bytes"),
                reply);
    return false;
  }
  if (size < kRequestHeaderSize || std::memcmp(data, fast::kRequestMagic, 4) != 0) {
    CountRefused("malformed");
    WriteHeader(kInvalidArgument, 0,
                absl::StrCat("expected a request of at least ", kRequestHeaderSize,
                             " bytes starting \"MCQ1\""),
                reply);
    return false;
  }
  const uint32_t method = fast::LoadLe32(data + 4);
  const uint64_t call_id = fast::LoadLe64(data + 8);
  const char* body = data + kRequestHeaderSize;
  const size_t body_size = size - kRequestHeaderSize;
  if (method == 0 || method > fast::kLastMethod) {
    CountRefused("malformed");
    WriteHeader(kInvalidArgument, call_id, absl::StrCat("unknown method ", method), reply);
    return false;
  }
  if (method == fast::kAttach) return Attach(conn, call_id, body, body_size, reply);
  if (!conn.attached) {
    CountCall(method, kUnauthenticated);
    CountRefused("attach");
    WriteHeader(kUnauthenticated, call_id, "the connection's first call must be ATTACH", reply);
    return false;
  }
  switch (method) {
    case fast::kBatchPut:
      Call(&FastStoreCalls::BatchPut, conn, method, call_id, body, body_size, reply, arena);
      break;
    case fast::kBatchGet:
      Call(&FastStoreCalls::BatchGet, conn, method, call_id, body, body_size, reply, arena);
      break;
    case fast::kBatchExist:
      Call(&FastStoreCalls::BatchExist, conn, method, call_id, body, body_size, reply, arena);
      break;
    case fast::kMatchPrefix:
      Call(&FastStoreCalls::MatchPrefix, conn, method, call_id, body, body_size, reply, arena);
      break;
    case fast::kReleaseLease:
      Call(&FastStoreCalls::ReleaseLease, conn, method, call_id, body, body_size, reply, arena);
      break;
    default:
      Call(&FastStoreCalls::BatchRemove, conn, method, call_id, body, body_size, reply, arena);
      break;
  }
  return true;
}

}  // namespace mc::client
