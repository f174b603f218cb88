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
    : options_(std::move(options)) {}

MasterLaneClient::~MasterLaneClient() {
  absl::MutexLock lock(&mu_);
  for (int fd : idle_) close(fd);
  idle_.clear();
}

int MasterLaneClient::Connect() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(options_.port);
  if (getaddrinfo(options_.host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
    return -1;
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    SetTimeouts(fd, options_.timeout_ms);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  return fd;
}

int MasterLaneClient::Take() {
  {
    absl::MutexLock lock(&mu_);
    while (!idle_.empty()) {
      const int fd = idle_.back();
      idle_.pop_back();
      // An idle connection has nothing to read: readable means the master closed it (it
      // stopped or restarted). Sending on it would lose the answer of a call that never ran.
      pollfd p{.fd = fd, .events = POLLIN | POLLRDHUP, .revents = 0};
      if (poll(&p, 1, 0) == 0) return fd;
      close(fd);
      --open_;
    }
    if (open_ >= options_.max_connections || absl::Now() < backoff_until_) return kBusy;
    ++open_;
  }
  const int fd = Connect();
  if (fd < 0) Give(-1, false);
  return fd;
}

void MasterLaneClient::Give(int fd, bool healthy) {
  absl::MutexLock lock(&mu_);
  if (healthy) {
    idle_.push_back(fd);
    return;
  }
  if (fd >= 0) close(fd);
  --open_;
  backoff_until_ = absl::Now() + absl::Milliseconds(options_.backoff_ms);
}

MasterLaneClient::Outcome MasterLaneClient::Call(uint32_t method, std::string_view credential,
                                                 const google::protobuf::MessageLite& req,
                                                 google::protobuf::MessageLite* resp,
                                                 grpc::Status* status, std::string* leader) {
  if (req.ByteSizeLong() > options_.max_message_bytes) return Outcome::kNotSent;
  const int fd = Take();
  if (fd == kBusy) return Outcome::kBusy;
  if (fd < 0) return Outcome::kNotSent;
  const uint64_t call_id = next_call_id_.fetch_add(1, std::memory_order_relaxed);
  std::string frame;
  lane::AppendRequest(method, call_id, credential, req, &frame);
  size_t sent = 0;
  while (sent < frame.size()) {
    const ssize_t n = send(fd, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // Not all of the frame left: the master never sees a whole request, so never runs it.
      Give(fd, false);
      return Outcome::kNotSent;
    }
    sent += static_cast<size_t>(n);
  }
  const lane::ReadExactly read = [fd](char* dst, size_t n) {
    size_t have = 0;
    while (have < n) {
      const ssize_t r = recv(fd, dst + have, n - have, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      have += static_cast<size_t>(r);
    }
    return true;
  };
  lane::Reply reply;
  if (!lane::ReadReply(read, options_.max_message_bytes, &reply).ok() || reply.call_id != call_id ||
      (reply.code == 0 && !resp->ParseFromString(reply.body))) {
    Give(fd, false);
    return Outcome::kLost;
  }
  Give(fd, true);
  *status = grpc::Status(static_cast<grpc::StatusCode>(reply.code), std::move(reply.message));
  *leader = std::move(reply.leader);
  return Outcome::kAnswered;
}

int MasterLaneClient::OpenConnectionsForTest() {
  absl::MutexLock lock(&mu_);
  return open_;
}

}  // namespace mc::client
