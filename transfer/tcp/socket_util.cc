#include "transfer/tcp/socket_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status.h"
#include "common/util.h"

namespace mc::transfer::tcp {
namespace {

absl::Status Errno(Code code, const std::string& what) {
  return McError(code, absl::StrCat(what, ": ", std::strerror(errno)));
}

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { freeaddrinfo(ai); }
};

absl::StatusOr<std::unique_ptr<addrinfo, AddrInfoDeleter>> Resolve(const std::string& endpoint,
                                                                   bool passive) {
  absl::StatusOr<HostPort> hp = ParseHostPort(endpoint);
  if (!hp.ok()) return McError(Code::kInvalidArgument, std::string(hp.status().message()));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string port = std::to_string(hp->port);
  addrinfo* res = nullptr;
  const char* host = hp->host.empty() ? nullptr : hp->host.c_str();
  if (int rc = getaddrinfo(host, port.c_str(), &hints, &res); rc != 0) {
    return McError(Code::kUnavailable, absl::StrCat("resolve ", endpoint, ": ", gai_strerror(rc)));
  }
  return std::unique_ptr<addrinfo, AddrInfoDeleter>(res);
}

std::string FormatAddress(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
    return absl::StrCat("[", host, "]:", port);
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
  inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
  port = ntohs(a->sin_port);
  return absl::StrCat(host, ":", port);
}

// Waits for a non-blocking connect to finish.
absl::Status FinishConnect(int fd, const std::string& endpoint, int64_t deadline_ms) {
  while (true) {
    int timeout = -1;
    if (deadline_ms != 0) {
      const int64_t left = deadline_ms - RealClock::Get().NowMs();
      if (left <= 0) return McError(Code::kTransferFailed, "deadline");
      timeout = static_cast<int>(std::min<int64_t>(left, 1 << 30));
    }
    pollfd pfd{fd, POLLOUT, 0};
    const int rc = poll(&pfd, 1, timeout);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return Errno(Code::kUnavailable, "poll");
    if (rc == 0) continue;  // re-check the deadline
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      absl::Status refused =
          McError(Code::kUnavailable, absl::StrCat("connect ", endpoint, ": ", std::strerror(err)));
      // Nothing listens there: the holder is gone (the batch paths back off and report it).
      return err == ECONNREFUSED ? MarkPeerUnreachable(std::move(refused)) : refused;
    }
    return absl::OkStatus();
  }
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

int UniqueFd::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

void TuneSocket(int fd, SocketBuffers buffers) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (buffers.send_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffers.send_bytes, sizeof(buffers.send_bytes));
  }
  if (buffers.receive_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffers.receive_bytes, sizeof(buffers.receive_bytes));
  }
  ApplyReceiveFloor(fd, buffers);
}

void ApplyReceiveFloor(int fd, SocketBuffers buffers) {
  if (buffers.receive_bytes == 0 && buffers.receive_floor_bytes > 0) {
    // Linux (tcp_set_rcvlowat) grows the receive buffer of a socket that autotunes it to hold a
    // window of SO_RCVLOWAT bytes (the mark capped at tcp_rmem[2] / 2), without locking it as
    // SO_RCVBUF would, and keeps it when the mark goes back to 1 byte (the default, which the
    // poll loops rely on). Older kernels ignore the first call; both are best effort.
    const int mark = buffers.receive_floor_bytes / 2;
    const int one_byte = 1;
    setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &mark, sizeof(mark));
    setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &one_byte, sizeof(one_byte));
  }
}

absl::StatusOr<UniqueFd> ListenTcp(const std::string& endpoint, SocketBuffers buffers,
                                   std::string* bound) {
  auto ai = Resolve(endpoint, /*passive=*/true);
  if (!ai.ok()) return ai.status();
  const addrinfo* a = ai->get();
  UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
  if (!fd.valid()) return Errno(Code::kUnavailable, "socket");
  const int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  TuneSocket(fd.get(), buffers);  // accepted sockets inherit the buffer sizes
  if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
    return Errno(Code::kUnavailable, absl::StrCat("bind ", endpoint));
  }
  if (::listen(fd.get(), 128) != 0) return Errno(Code::kUnavailable, "listen");
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return Errno(Code::kUnavailable, "getsockname");
  }
  if (bound != nullptr) *bound = FormatAddress(ss);
  return fd;
}

absl::StatusOr<UniqueFd> ConnectTcp(const std::string& endpoint, SocketBuffers buffers,
                                    int64_t deadline_ms) {
  auto ai = Resolve(endpoint, /*passive=*/false);
  if (!ai.ok()) return ai.status();
  const addrinfo* a = ai->get();
  UniqueFd fd(
      ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
  if (!fd.valid()) return Errno(Code::kUnavailable, "socket");
  TuneSocket(fd.get(), buffers);  // before connect: the window scale follows SO_RCVBUF
  if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      const bool refused = errno == ECONNREFUSED;
      absl::Status s = Errno(Code::kUnavailable, absl::StrCat("connect ", endpoint));
      return refused ? MarkPeerUnreachable(std::move(s)) : s;
    }
    if (absl::Status s = FinishConnect(fd.get(), endpoint, deadline_ms); !s.ok()) return s;
  }
  return fd;
}

size_t ConsumeIov(iovec* iov, size_t count, size_t first, uint64_t n) {
  while (n > 0 && first < count) {
    if (n >= iov[first].iov_len) {
      n -= iov[first].iov_len;
      iov[first].iov_len = 0;
      ++first;
    } else {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + n;
      iov[first].iov_len -= n;
      n = 0;
    }
  }
  while (first < count && iov[first].iov_len == 0) ++first;
  return first;
}

absl::Status SendAll(int fd, iovec* iov, int iovcnt) {
  size_t first = ConsumeIov(iov, iovcnt, 0, 0);
  while (first < static_cast<size_t>(iovcnt)) {
    msghdr msg{};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = std::min<size_t>(iovcnt - first, IOV_MAX);
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno(Code::kUnavailable, "send");
    first = ConsumeIov(iov, iovcnt, first, static_cast<uint64_t>(n));
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, void* data, uint64_t length) {
  char* p = static_cast<char*>(data);
  while (length > 0) {
    const ssize_t n = ::recv(fd, p, length, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno(Code::kUnavailable, "recv");
    if (n == 0) return McError(Code::kUnavailable, "peer closed the connection");
    p += n;
    length -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status SkipBytes(int fd, uint64_t length) {
  char scratch[64 << 10];
  while (length > 0) {
    const uint64_t n = std::min<uint64_t>(length, sizeof(scratch));
    if (absl::Status s = RecvAll(fd, scratch, n); !s.ok()) return s;
    length -= n;
  }
  return absl::OkStatus();
}

}  // namespace mc::transfer::tcp
