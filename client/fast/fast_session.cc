#include "client/fast/fast_session.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace mc::client {

absl::StatusOr<std::unique_ptr<FastSession>> FastSession::Open(const std::string& path,
                                                               std::string_view token,
                                                               int64_t timeout_ms) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("bad fast socket path '", path, "'"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (sock < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  std::unique_ptr<FastSession> session(new FastSession(sock, timeout_ms));
  if (connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(absl::StrCat("connect(", path, "): ", std::strerror(errno)));
  }
  // Our requests may be as large as the daemon allows: room for the largest.
  const int want = static_cast<int>(fast::kMaxMessageBytes);
  [[maybe_unused]] int rc = setsockopt(sock, SOL_SOCKET, SO_SNDBUF, &want, sizeof(want));
  session->send_.assign(fast::kRequestHeaderSize, '\0');
  session->send_.append(token);
  size_t offset = 0;
  size_t size = 0;
  if (absl::Status s = session->Exchange(fast::kAttach, &offset, &size); !s.ok()) return s;
  if (size < 4) return absl::InternalError("the fast channel's ATTACH answer has no limit");
  const uint32_t limit = fast::LoadLe32(session->recv_.data() + offset);
  if (limit < fast::kMinMessageBytes || limit > fast::kMaxMessageBytes) {
    return absl::InternalError(absl::StrCat("the fast channel announced a limit of ", limit));
  }
  // What our own send buffer allows bounds our requests too.
  int got = 0;
  socklen_t len = sizeof(got);
  if (getsockopt(sock, SOL_SOCKET, SO_SNDBUF, &got, &len) == 0 && got > 1024) {
    session->max_message_bytes_ = std::min<uint32_t>(limit, static_cast<uint32_t>(got - 1024));
  } else {
    session->max_message_bytes_ = fast::kMinMessageBytes;
  }
  session->recv_.resize(limit);
  return session;
}

FastSession::~FastSession() { close(sock_); }

absl::Status FastSession::Exchange(uint32_t method, size_t* body_offset, size_t* body_size) {
  if (broken_) return absl::UnavailableError("the fast channel connection failed earlier");
  const uint64_t call_id = next_call_id_++;
  fast::PutRequestHeader(send_.data(), method, call_id);
  if (send(sock_, send_.data(), send_.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(send_.size())) {
    broken_ = true;
    return absl::UnavailableError(absl::StrCat("fast channel send: ", std::strerror(errno)));
  }
  if (recv_.size() < fast::kMinMessageBytes) recv_.resize(fast::kMinMessageBytes);  // ATTACH
  pollfd p{sock_, POLLIN, 0};
  int rc = 0;
  do {
    rc = poll(&p, 1, static_cast<int>(timeout_ms_));
  } while (rc < 0 && errno == EINTR);
  if (rc <= 0) {
    broken_ = true;
    return absl::DeadlineExceededError("no answer on the fast channel in time");
  }
  ssize_t n = recv(sock_, recv_.data(), recv_.size(), MSG_TRUNC);
  if (n < static_cast<ssize_t>(fast::kReplyHeaderSize) || n > static_cast<ssize_t>(recv_.size()) ||
      std::memcmp(recv_.data(), fast::kReplyMagic, 4) != 0) {
    broken_ = true;
    return absl::UnavailableError(n == 0 ? "the daemon closed the fast channel"
                                         : "malformed answer on the fast channel");
  }
  const uint32_t code = fast::LoadLe32(recv_.data() + 4);
  const uint64_t got_id = fast::LoadLe64(recv_.data() + 8);
  const uint32_t message = fast::LoadLe32(recv_.data() + 16);
  if (message > static_cast<size_t>(n) - fast::kReplyHeaderSize) {
    broken_ = true;
    return absl::UnavailableError("malformed answer on the fast channel");
  }
  if (code != 0) {
    // Refusals before the call was read (call_id 0) are answers too; the daemon then closes.
    return absl::Status(static_cast<absl::StatusCode>(code),
                        std::string(recv_.data() + fast::kReplyHeaderSize, message));
  }
  if (got_id != call_id) {
    broken_ = true;
    return absl::UnavailableError("the fast channel answered another call");
  }
  *body_offset = fast::kReplyHeaderSize + message;
  *body_size = static_cast<size_t>(n) - *body_offset;
  return absl::OkStatus();
}

absl::Status FastSession::Call(uint32_t method, const google::protobuf::MessageLite& req,
                               google::protobuf::MessageLite* resp) {
  const size_t size = req.ByteSizeLong();
  if (size + fast::kRequestHeaderSize > max_message_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a request of ", size + fast::kRequestHeaderSize,
                     " bytes exceeds the fast channel's limit of ", max_message_bytes_));
  }
  send_.resize(fast::kRequestHeaderSize + size);
  req.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(send_.data()) +
                                      fast::kRequestHeaderSize);
  size_t offset = 0;
  size_t body = 0;
  if (absl::Status s = Exchange(method, &offset, &body); !s.ok()) return s;
  if (!resp->ParseFromArray(recv_.data() + offset, static_cast<int>(body))) {
    return absl::InternalError("the fast channel's answer does not parse");
  }
  return absl::OkStatus();
}

}  // namespace mc::client
