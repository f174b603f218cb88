#include "client/buffers/fd_session.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/byte_order.h"

namespace mc::client {

std::string FdRequest(uint32_t op, uint64_t size) {
  std::string r = "MCF1";
  AppendLe(r, op);
  AppendLe(r, size);
  return r;
}

std::string DefaultFdSocket(std::string_view store_address) {
  if (store_address.substr(0, 5) == "unix:") {
    return absl::StrCat(std::string(store_address.substr(5)), ".fd");
  }
  if (!store_address.empty() && store_address[0] == '/') {
    return absl::StrCat(std::string(store_address), ".fd");
  }
  return "";
}

absl::StatusOr<std::unique_ptr<FdSession>> FdSession::Open(const std::string& path,
                                                           int64_t timeout_ms) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("bad fd socket path '", path, "'"));
  }
  int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (sock < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  std::unique_ptr<FdSession> session(new FdSession(sock));
  timeval tv{static_cast<time_t>(timeout_ms / 1000),
             static_cast<suseconds_t>((timeout_ms % 1000) * 1000)};
  setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach the daemon's fd socket ", path, ": ", std::strerror(errno)));
  }
  std::string handle;
  absl::Status s = session->Ask(FdRequest(kFdOpHello, 0), -1, &session->owner_, &handle);
  if (!s.ok()) return s;
  return session;
}

FdSession::~FdSession() { close(sock_); }

absl::Status FdSession::Ask(const std::string& msg, int fd, std::string* owner,
                            std::string* handle) {
  iovec iov{const_cast<char*>(msg.data()), msg.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (fd >= 0) {
    mh.msg_control = control;
    mh.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  if (sendmsg(sock_, &mh, MSG_NOSIGNAL) != static_cast<ssize_t>(msg.size())) {
    return absl::UnavailableError(absl::StrCat("fd socket: send: ", std::strerror(errno)));
  }
  char reply[1024];
  ssize_t n = recv(sock_, reply, sizeof(reply), 0);
  if (n <= 0) {
    return absl::UnavailableError(n == 0 ? "fd socket: the daemon closed the session"
                                         : absl::StrCat("fd socket: recv: ", std::strerror(errno)));
  }
  std::vector<std::string> parts =
      absl::StrSplit(absl::string_view(reply, static_cast<size_t>(n)), absl::MaxSplits(' ', 2));
  if (parts.size() == 3 && parts[0] == "OK") {
    *owner = parts[1];
    *handle = parts[2];
    return absl::OkStatus();
  }
  std::string text(reply, static_cast<size_t>(n));
  if (parts.size() >= 2 && parts[1] == "RESOURCE_EXHAUSTED") {
    return absl::ResourceExhaustedError(text);
  }
  if (parts.size() >= 2 && parts[1] == "UNAVAILABLE") return absl::UnavailableError(text);
  return absl::InvalidArgumentError(text);
}

absl::StatusOr<std::string> FdSession::Register(int fd, uint64_t size) {
  std::string owner;
  std::string handle;
  absl::Status s = Ask(FdRequest(kFdOpRegister, size), fd, &owner, &handle);
  if (!s.ok()) return s;
  return handle;
}

}  // namespace mc::client
