#include "client/session/master_lane_client.h"

#include <google/protobuf/message_lite.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/time/clock.h"
#include "proto/master_lane_frame.h"

namespace mc::client {
namespace {

constexpr int kBusy = -2;

void SetTimeouts(int fd, int64_t ms) {
  timeval tv{.tv_sec = ms / 1000, .tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));  // bounds connect() too
}

}  // namespace

MasterLaneClient::MasterLaneClient(MasterLaneClientOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : RealClock::Get()) {}

MasterLaneClient::~MasterLaneClient() {
  absl::MutexLock lock(&mu_);
  for (Conn& c : idle_) Close(c);
  idle_.clear();
}

MasterLaneClient::Conn MasterLaneClient::Connect() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(options_.port);
  if (getaddrinfo(options_.host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
    return {};
  }
  Conn conn;
  conn.fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (conn.fd >= 0) {
    SetTimeouts(conn.fd, options_.timeout_ms);
    int one = 1;
    setsockopt(conn.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // Connected is not enough: the kernel completes the handshake before the master accepts.
    // Only a "ready" greeting (within the timeout) says the master will read what is sent.
    // With TLS, the handshake (bounded) first: the greeting comes over TLS.
    absl::StatusOr<uint32_t> idle_ms = absl::UnavailableError("not connected");
    if (connect(conn.fd, res->ai_addr, res->ai_addrlen) == 0) {
      if (options_.tls != nullptr) {
        absl::StatusOr<std::unique_ptr<lane::Stream>> s =
            options_.tls->Connect(conn.fd, options_.tls_host, options_.timeout_ms);
        if (s.ok()) conn.stream = std::move(*s);
      } else {
        conn.stream = std::make_shared<lane::Stream>(conn.fd, nullptr);
      }
    }
    if (conn.stream != nullptr) {
      idle_ms = lane::ReadGreeting(conn.stream->Reader());
    }
    if (idle_ms.ok()) {
      conn.reuse_ms = *idle_ms / 2;
      connected_.fetch_add(1, std::memory_order_relaxed);
    } else {
      Close(conn);
    }
  }
  freeaddrinfo(res);
  return conn;
}

MasterLaneClient::Conn MasterLaneClient::Take() {
  {
    absl::MutexLock lock(&mu_);
    const int64_t now = clock_.NowMs();
    while (!idle_.empty()) {
      Conn c = std::move(idle_.back());
      idle_.pop_back();
      // Idle for half the master's idle timeout: the master may close it just as a request
      // leaves, losing the answer; open a new one instead. An idle connection has nothing to
      // read either: readable means the master closed it (it stopped or restarted).
      pollfd p{.fd = c.fd, .events = POLLIN | POLLRDHUP, .revents = 0};
      if (now - c.idle_since_ms < c.reuse_ms && poll(&p, 1, 0) == 0) return c;
      Close(c);
      --open_;
    }
    if (open_ >= options_.max_connections || absl::Now() < backoff_until_) {
      Conn busy;
      busy.fd = kBusy;
      return busy;
    }
    ++open_;
  }
  Conn c = Connect();
  if (c.fd >= 0) return c;
  Give(std::move(c), false);
  return Conn{};
}

void MasterLaneClient::Close(Conn& conn) {
  conn.stream.reset();  // before the fd it uses
  if (conn.fd >= 0) close(conn.fd);
  conn.fd = -1;
}

void MasterLaneClient::Give(Conn conn, bool healthy) {
  absl::MutexLock lock(&mu_);
  if (healthy) {
    conn.idle_since_ms = clock_.NowMs();
    lane::TrimBuffer(conn.frame);
    lane::TrimBuffer(conn.reply.body);
    idle_.push_back(std::move(conn));
    return;
  }
  Close(conn);
  --open_;
  backoff_until_ = absl::Now() + absl::Milliseconds(options_.backoff_ms);
}

MasterLaneClient::Outcome MasterLaneClient::Call(uint32_t method, std::string_view credential,
                                                 const google::protobuf::MessageLite& req,
                                                 google::protobuf::MessageLite* resp,
                                                 grpc::Status* status, std::string* leader) {
  if (req.ByteSizeLong() > options_.max_message_bytes) return Outcome::kNotSent;
  Conn conn = Take();
  if (conn.fd == kBusy) return Outcome::kBusy;
  if (conn.fd < 0) return Outcome::kNotSent;
  const uint64_t call_id = next_call_id_.fetch_add(1, std::memory_order_relaxed);
  conn.frame.clear();
  lane::AppendRequest(method, call_id, credential, req, &conn.frame);
  if (!conn.stream->WriteAll(conn.frame)) {
    // Not all of the frame left: the master never sees a whole request, so never runs it.
    // (With TLS a record cut short is refused by the master's TLS layer, never parsed.)
    Give(std::move(conn), false);
    return Outcome::kNotSent;
  }
  lane::Reply& reply = conn.reply;
  if (!lane::ReadReply(conn.stream->Reader(), options_.max_message_bytes, &reply).ok() ||
      reply.call_id != call_id || (reply.code == 0 && !resp->ParseFromString(reply.body))) {
    Give(std::move(conn), false);
    return Outcome::kLost;
  }
  *status = reply.code == 0
                ? grpc::Status::OK
                : grpc::Status(static_cast<grpc::StatusCode>(reply.code), reply.message);
  leader->assign(reply.leader);
  Give(std::move(conn), true);
  return Outcome::kAnswered;
}

int MasterLaneClient::OpenConnectionsForTest() {
  absl::MutexLock lock(&mu_);
  return open_;
}

}  // namespace mc::client
