#include "client/buffers/fd_channel.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace mc::client {
namespace {

constexpr int kMaxFdsPerMessage = 8;  // room to receive (and close) a few extra
constexpr size_t kMaxMessage = 256;   // longer datagrams are truncated and refused

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint32_t Le32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
uint64_t Le64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::string Err(const absl::Status& s) {
  return absl::StrCat("ERR ", absl::StatusCodeToString(s.code()), " ", s.message());
}

}  // namespace

FdChannelServer::FdChannelServer(FdChannelOptions options, BufferRegistry& buffers,
                                 MetricsRegistry& metrics)
    : options_(std::move(options)), buffers_(buffers), metrics_(metrics) {
  metrics_.AddCallbackGauge("mc_store_fd_sessions", "Open fd side-channel sessions",
                            [this] { return static_cast<double>(Sessions()); });
}

FdChannelServer::~FdChannelServer() { Stop(); }

absl::Status FdChannelServer::Start() {
  sockaddr_un addr{};
  if (options_.path.empty() || options_.path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fd socket path '", options_.path, "' is empty or longer than ", sizeof(addr.sun_path) - 1,
        " bytes (shorten --unix_socket or set --store_fd_socket)"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, options_.path.data(), options_.path.size());
  listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  if (absl::Status s = BindPrivateSocket(listen_fd_, addr, options_.mode, options_.group);
      !s.ok()) {
    return s;
  }
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void FdChannelServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (thread_.joinable()) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  for (auto& [fd, conn] : conns_) Close(conn);
  conns_.clear();
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    listen_fd_ = -1;
    unlink(options_.path.c_str());
  }
  if (wake_fd_ >= 0) close(wake_fd_);
  wake_fd_ = -1;
}

bool FdChannelServer::IsLive(std::string_view owner) const {
  absl::MutexLock lock(&mu_);
  return live_owners_.contains(std::string(owner));
}

std::string FdChannelServer::AccountOfUid(uid_t uid) { return absl::StrCat("uid:", uid); }

std::string FdChannelServer::AccountOf(std::string_view owner) const {
  absl::MutexLock lock(&mu_);
  auto it = live_owners_.find(std::string(owner));
  return it == live_owners_.end() ? std::string(owner) : AccountOfUid(it->second);
}

std::optional<uid_t> FdChannelServer::UidOf(std::string_view owner) const {
  absl::MutexLock lock(&mu_);
  auto it = live_owners_.find(std::string(owner));
  if (it == live_owners_.end()) return std::nullopt;
  return it->second;
}

size_t FdChannelServer::Sessions() const {
  absl::MutexLock lock(&mu_);
  return live_owners_.size();
}

void FdChannelServer::Count(const char* result) {
  metrics_
      .GetCounter("mc_store_fd_messages_total",
                  "Messages and connections on the fd side channel, by result",
                  {{"result", result}})
      .Inc();
}

void FdChannelServer::Close(Conn& conn) {
  if (conn.fd < 0) return;
  close(conn.fd);
  conn.fd = -1;
  if (conn.owner.empty()) return;
  {
    absl::MutexLock lock(&mu_);
    live_owners_.erase(conn.owner);
  }
  size_t released = buffers_.ReleaseOwner(conn.owner);
  for (const SessionEndHook& hook : session_end_hooks_) released += hook(conn.owner);
  if (released > 0) {
    Logger("client").info("fd session of pid {} uid {} ended: released its {} buffer(s)", conn.pid,
                          conn.uid, released);
  }
}

void FdChannelServer::Accept() {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;  // EAGAIN, or a transient error (EMFILE...): try at the next wakeup
    Conn conn;
    conn.fd = fd;
    conn.accepted_ms = NowMs();
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      conn.pid = cred.pid;
      conn.uid = cred.uid;
    }
    int same_uid = 0;
    for (const auto& [other_fd, other] : conns_) same_uid += other.uid == conn.uid ? 1 : 0;
    const char* refused = nullptr;
    if (static_cast<int>(conns_.size()) >= options_.max_connections) {
      refused = "ERR UNAVAILABLE too many fd sessions (--store_fd_max_connections)";
    } else if (same_uid >= options_.max_connections_per_uid) {
      refused =
          "ERR UNAVAILABLE too many fd sessions of this uid "
          "(--store_fd_max_connections_per_uid)";
    }
    if (refused != nullptr) {
      send(fd, refused, std::strlen(refused), MSG_DONTWAIT | MSG_NOSIGNAL);
      close(fd);
      Count("refused_connection");
      continue;
    }
    absl::StatusOr<std::string> owner = RandomHexToken();
    if (!owner.ok()) {
      close(fd);
      continue;
    }
    conn.owner = *owner;
    {
      absl::MutexLock lock(&mu_);
      live_owners_.emplace(conn.owner, conn.uid);
    }
    conns_.emplace(fd, std::move(conn));
  }
}

std::string FdChannelServer::Handle(Conn& conn, const char* msg, ssize_t len, int msg_flags,
                                    int* fds, int nfds) {
  // Every fd received is closed unless MapFd takes it.
  auto close_from = [&](int first) {
    for (int i = first; i < nfds; ++i) close(fds[i]);
  };
  if ((msg_flags & MSG_CTRUNC) != 0) {
    close_from(0);
    Count("bad_message");
    return "ERR INVALID_ARGUMENT too many file descriptors in one message (send one)";
  }
  if ((msg_flags & MSG_TRUNC) != 0 || len != static_cast<ssize_t>(kFdRequestSize) ||
      std::memcmp(msg, "MCF1", 4) != 0) {
    close_from(0);
    Count("bad_message");
    return absl::StrCat("ERR INVALID_ARGUMENT expected a ", kFdRequestSize,
                        "-byte request starting \"MCF1\"");
  }
  const uint32_t op = Le32(msg + 4);
  const uint64_t size = Le64(msg + 8);
  if (op == kFdOpHello) {
    close_from(0);
    if (nfds != 0) {
      Count("bad_message");
      return "ERR INVALID_ARGUMENT HELLO carries no file descriptor";
    }
    Count("hello");
    return absl::StrCat("OK ", conn.owner, " -");
  }
  if (op == kFdOpRegisterGpu) {
    if (nfds != 1) {
      close_from(0);
      Count("bad_message");
      return absl::StrCat(
          "ERR INVALID_ARGUMENT REGISTER_GPU carries exactly one file descriptor, got ", nfds);
    }
    if (gpu_fd_tickets_ == nullptr) {
      close_from(0);
      Count("refused_gpu_handle");
      return "ERR INVALID_ARGUMENT this mc-client serves no GPU buffers (no --cuda_device)";
    }
    absl::StatusOr<uint64_t> ticket = gpu_fd_tickets_->Park(fds[0], conn.owner);  // takes it
    if (!ticket.ok()) {
      Count("refused_gpu_handle");
      return Err(ticket.status());
    }
    Logger("client").info("fd session of pid {} uid {}: GPU handle parked", conn.pid, conn.uid);
    Count("gpu_handle");
    return absl::StrCat("OK ", conn.owner, " ", *ticket);
  }
  if (op != kFdOpRegister) {
    close_from(0);
    Count("bad_message");
    return absl::StrCat("ERR INVALID_ARGUMENT unknown op ", op);
  }
  if (nfds != 1) {
    close_from(0);
    Count("bad_message");
    return absl::StrCat("ERR INVALID_ARGUMENT REGISTER carries exactly one file descriptor, got ",
                        nfds);
  }
  absl::StatusOr<BufferRef> mapped =
      BufferRegistry::MapFd(fds[0], size, absl::StrCat("fd of pid ", conn.pid, " uid ", conn.uid));
  if (!mapped.ok()) {
    Count("refused_buffer");
    Logger("client").warn("fd session of pid {} uid {}: {}", conn.pid, conn.uid,
                          std::string(mapped.status().message()));
    return Err(mapped.status());
  }
  absl::StatusOr<std::string> handle =
      buffers_.Stage(*std::move(mapped), conn.owner, AccountOfUid(conn.uid));
  if (!handle.ok()) {
    Count("refused_buffer");
    return Err(handle.status());
  }
  Count("registered");
  return absl::StrCat("OK ", conn.owner, " ", *handle);
}

bool FdChannelServer::Serve(Conn& conn) {
  char msg[kMaxMessage];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  iovec iov{msg, sizeof(msg)};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof(control);
  ssize_t n = recvmsg(conn.fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0) return errno == EAGAIN || errno == EINTR;
  int fds[kMaxFdsPerMessage];
  int nfds = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count && nfds < kMaxFdsPerMessage; ++i) {
      std::memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
    }
  }
  if (n == 0 && nfds == 0) return false;  // the peer closed the session
  conn.spoke = true;
  std::string reply = Handle(conn, msg, n, mh.msg_flags, fds, nfds);
  // A peer that does not read its answers loses the session.
  return send(conn.fd, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL) ==
         static_cast<ssize_t>(reply.size());
}

void FdChannelServer::Loop() {
  std::vector<pollfd> pfds;
  while (!stopping_.load()) {
    pfds.clear();
    pfds.push_back({wake_fd_, POLLIN, 0});
    pfds.push_back({listen_fd_, POLLIN, 0});
    for (const auto& [fd, conn] : conns_) pfds.push_back({fd, POLLIN, 0});
    int rc = poll(pfds.data(), pfds.size(), 200);
    if (rc < 0 && errno != EINTR) {
      Logger("client").error("fd channel poll: {}", std::strerror(errno));
      return;
    }
    if (stopping_.load()) return;
    for (size_t i = 2; i < pfds.size(); ++i) {
      if (pfds[i].revents == 0) continue;
      auto it = conns_.find(pfds[i].fd);
      if (it == conns_.end()) continue;
      bool keep = (pfds[i].revents & POLLIN) != 0 ? Serve(it->second)
                                                  : (pfds[i].revents & (POLLHUP | POLLERR)) == 0;
      if (!keep) {
        Close(it->second);
        conns_.erase(it);
      }
    }
    // Connections that never said anything go after first_message_timeout_ms.
    const int64_t now = NowMs();
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (!it->second.spoke && now - it->second.accepted_ms > options_.first_message_timeout_ms) {
        Count("timed_out");
        Close(it->second);
        conns_.erase(it++);
      } else {
        ++it;
      }
    }
    if ((pfds[1].revents & POLLIN) != 0) Accept();
  }
}

}  // namespace mc::client
