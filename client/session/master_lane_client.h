// MasterLaneClient: the daemon's end of the master lane (docs/architecture.md, "The master
// lane"; wire format proto/master_lane_frame.h): the calling thread sends one request frame and
// blocks for the reply on a plain TCP connection, instead of gRPC's hand-offs between threads.
// Up to max_connections blocking sockets (TCP_NODELAY; send and receive time out after
// timeout_ms), opened as needed: a call takes an idle one, or opens one while under the bound;
// when all are busy it is not sent (the caller uses gRPC). A new connection is used only once
// the master greeted it "ready" (proto/master_lane_frame.h): a full or stopping master closes
// it without reading anything, so nothing is lost. An idle connection is reused only within
// half the idle timeout the master's greeting named (the master closes it at the full
// timeout, and a close landing just as a request leaves would lose that request's answer);
// past that it is closed and a new one opened. A connection that fails is closed, and none is
// opened again for backoff_ms. The lane knows nothing of sessions or leaders: the
// caller (client/session/master_client.cc) passes the credential and decides what a failure
// means. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <grpcpp/support/status.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "proto/lane_tls.h"
#include "proto/master_lane_frame.h"

namespace google::protobuf {
class MessageLite;
}

namespace mc::client {

struct MasterLaneClientOptions {
  std::string host;             // the master's host as this client reaches it
  int port = 0;                 // the lane port its registration answer named
  int64_t timeout_ms = 10'000;  // per send and per receive (the RPC deadline)
  int max_connections = 4;
  size_t max_message_bytes = 256 << 20;
  int64_t backoff_ms = 1000;     // after a failed connection, no new one this long
  const Clock* clock = nullptr;  // for the idle bound; null = RealClock
  // TLS (proto/lane_tls.h) when set: the handshake (within timeout_ms) before the greeting, the
  // master's certificate checked against tls_host (a DNS name or an IP address).
  std::shared_ptr<const lane::TlsContext> tls{};
  std::string tls_host{};
};

class MasterLaneClient {
 public:
  explicit MasterLaneClient(MasterLaneClientOptions options);
  ~MasterLaneClient();  // closes the idle connections (none may be in use)
  MasterLaneClient(const MasterLaneClient&) = delete;
  MasterLaneClient& operator=(const MasterLaneClient&) = delete;

  enum class Outcome {
    kAnswered,  // *status (and *resp when OK, *leader for a standby's refusal) hold the answer
    kBusy,      // every connection in use (or backing off): not sent
    kNotSent,   // no connection, or the frame did not leave whole: certainly not executed
    kLost,      // sent whole, but no (valid) reply: it may have been executed
  };
  Outcome Call(uint32_t method, std::string_view credential,
               const google::protobuf::MessageLite& req, google::protobuf::MessageLite* resp,
               grpc::Status* status, std::string* leader) ABSL_LOCKS_EXCLUDED(mu_);

  // The methods this lane's master answered UNIMPLEMENTED: a master from before a call joined the
  // lane, which did not run it. The caller sends them over gRPC from then on; a later
  // registration brings a new MasterLaneClient, which asks again.
  bool Serves(uint32_t method) const {
    return method >= 64 || (not_served_.load(std::memory_order_relaxed) & (1ull << method)) == 0;
  }
  // True when this call marked it (false: marked before, or a method number past the mask).
  bool MarkNotServed(uint32_t method) {
    if (method >= 64) return false;
    return (not_served_.fetch_or(1ull << method, std::memory_order_relaxed) & (1ull << method)) ==
           0;
  }

  // Connections open now (idle or in use); connections the master greeted "ready" so far.
  int OpenConnectionsForTest() ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t ConnectedForTest() const { return connected_.load(); }

 private:
  // An open connection: reused while idle for less than reuse_ms (half the master's idle
  // timeout). Its request frame and reply are kept between calls, so that a call allocates
  // nothing for them once the connection has served one of its size (lane::TrimBuffer).
  struct Conn {
    int fd = -1;
    std::shared_ptr<lane::Stream> stream;  // over fd
    int64_t reuse_ms = 0;
    int64_t idle_since_ms = 0;
    std::string frame;
    lane::Reply reply;
  };
  // An idle connection, a new one (fd -1 when it failed), or fd -2 when busy / backing off.
  Conn Take() ABSL_LOCKS_EXCLUDED(mu_);
  void Give(Conn conn, bool healthy) ABSL_LOCKS_EXCLUDED(mu_);
  static void Close(Conn& conn);
  // A connection the master greeted "ready" (fd -1: none).
  Conn Connect();

  const MasterLaneClientOptions options_;
  const Clock& clock_;
  std::atomic<uint64_t> next_call_id_{1};
  std::atomic<uint64_t> connected_{0};
  std::atomic<uint64_t> not_served_{0};  // bit m: method m answered UNIMPLEMENTED
  absl::Mutex mu_;
  std::vector<Conn> idle_ ABSL_GUARDED_BY(mu_);
  int open_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time backoff_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace mc::client
