// FastSession: the application side of mc-client's fast channel (client/fast/fast_protocol.h has
// the format): one SOCK_SEQPACKET connection, attached with an fd session's owner token (or
// anonymously), over which Store calls go as one datagram each way. For C++ tools (mc-bench)
// and tests; the Python client has its own. One call at a time per session; open more for
// concurrency. Thread-compatible.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/fast/fast_protocol.h"
#include "google/protobuf/message_lite.h"

namespace mc::client {

class FastSession {
 public:
  // Connects to `path` and ATTACHes with `token` (an FdSession's owner; empty: the anonymous
  // Unix caller). `timeout_ms` bounds each call's wait for its answer.
  static absl::StatusOr<std::unique_ptr<FastSession>> Open(const std::string& path,
                                                           std::string_view token,
                                                           int64_t timeout_ms = 60'000);
  ~FastSession();
  FastSession(const FastSession&) = delete;
  FastSession& operator=(const FastSession&) = delete;

  // The largest datagram either way, as the daemon announced it.
  uint32_t max_message_bytes() const { return max_message_bytes_; }
  // Whether a request of `req`'s size fits in one datagram.
  bool Fits(const google::protobuf::MessageLite& req) const {
    return req.ByteSizeLong() + fast::kRequestHeaderSize <= max_message_bytes_;
  }

  // One Store call (method fast::kBatchPut...): the daemon's status (its gRPC code and message)
  // with `resp` parsed when OK; UNAVAILABLE when the connection failed (it is then unusable),
  // RESOURCE_EXHAUSTED (nothing sent) for a request over the limit.
  absl::Status Call(uint32_t method, const google::protobuf::MessageLite& req,
                    google::protobuf::MessageLite* resp);

 private:
  FastSession(int sock, int64_t timeout_ms) : sock_(sock), timeout_ms_(timeout_ms) {}
  // Sends the request in send_ (header filled here), waits for the reply in recv_; the reply's
  // status, and its body's offset and length in recv_.
  absl::Status Exchange(uint32_t method, size_t* body_offset, size_t* body_size);

  int sock_;
  const int64_t timeout_ms_;
  uint32_t max_message_bytes_ = fast::kMinMessageBytes;
  uint64_t next_call_id_ = 1;
  bool broken_ = false;
  std::string send_;  // reused
  std::string recv_;  // reused
};

}  // namespace mc::client
