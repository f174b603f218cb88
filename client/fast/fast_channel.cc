#include "client/fast/fast_channel.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mc::client {
namespace {

constexpr size_t kArenaBlockBytes = 64 << 10;  // each connection's first arena block, reused
constexpr int kReapEveryMs = 1000;             // the accepting thread joins ended connections
// The kernel refuses a datagram longer than the send buffer less a small reserve.
constexpr int kSendBufferReserve = 1024;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A reply that refuses a connection before it said anything (call_id 0), then nothing more.
void SendRefusal(int fd, uint32_t code, std::string_view message) {
  std::string reply(fast::kReplyHeaderSize, '\0');
  fast::PutReplyHeader(reply.data(), code, 0, static_cast<uint32_t>(message.size()));
  reply.append(message);
  [[maybe_unused]] ssize_t n = send(fd, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

}  // namespace

FastChannelServer::FastChannelServer(FastChannelOptions options, FastStoreCalls& calls,
                                     const CallerSessions* sessions, MetricsRegistry& metrics)
    : options_(std::move(options)), calls_(calls), sessions_(sessions), metrics_(metrics) {
  metrics_.AddCallbackGauge("mc_store_fast_connections", "Open fast-channel connections",
                            [this] { return static_cast<double>(Connections()); });
}

FastChannelServer::~FastChannelServer() { Stop(); }

uint32_t FastChannelServer::SizeSendBuffer(int fd, uint32_t bytes) {
  const int want = static_cast<int>(bytes) + kSendBufferReserve;
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &want, sizeof(want)) != 0) {
    // Without CAP_NET_ADMIN: capped at net.core.wmem_max.
    [[maybe_unused]] int rc = setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof(want));
  }
  int got = 0;
  socklen_t len = sizeof(got);
  if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &got, &len) != 0) return 0;
  const int64_t usable = static_cast<int64_t>(got) - kSendBufferReserve;
  return usable >= static_cast<int64_t>(bytes)
             ? bytes
             : static_cast<uint32_t>(std::max<int64_t>(usable, 0));
}

absl::Status FastChannelServer::Start() {
  sockaddr_un addr{};
  if (options_.path.empty() || options_.path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fast socket path '", options_.path, "' is empty or longer than ",
                     sizeof(addr.sun_path) - 1, " bytes (shorten --unix_socket)"));
  }
  if (options_.max_message_bytes < fast::kMinMessageBytes ||
      options_.max_message_bytes > fast::kMaxMessageBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--store_fast_max_message_bytes=", options_.max_message_bytes, " is outside ",
                     fast::kMinMessageBytes, "..", fast::kMaxMessageBytes));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, options_.path.data(), options_.path.size());
  listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  // The effective limit: what an accepted socket's send buffer allows (sockets inherit nothing
  // here, so the listening socket stands in for them).
  max_message_bytes_ = SizeSendBuffer(listen_fd_, options_.max_message_bytes);
  if (max_message_bytes_ < fast::kMinMessageBytes) {
    return absl::InternalError("the kernel allows no useful send buffer for the fast channel");
  }
  if (max_message_bytes_ < options_.max_message_bytes) {
    Logger("client").warn(
        "fast channel: the kernel caps the socket send buffer (net.core.wmem_max, no "
        "CAP_NET_ADMIN): datagrams are limited to {} bytes, not --store_fast_max_message_bytes={}",
        max_message_bytes_, options_.max_message_bytes);
  }
  dispatch_ = std::make_unique<FastDispatcher>(calls_, sessions_, max_message_bytes_, metrics_);
  if (absl::Status s = BindPrivateSocket(listen_fd_, addr, options_.mode, options_.group);
      !s.ok()) {
    return s;
  }
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  return absl::OkStatus();
}

void FastChannelServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));  // never read: stays set
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  std::list<std::unique_ptr<Conn>> conns;
  {
    absl::MutexLock lock(&mu_);
    conns.swap(conns_);
  }
  // Each thread sees the wake fd at its next poll (after the call it serves, if any).
  for (auto& conn : conns) {
    if (conn->thread.joinable()) conn->thread.join();
  }
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    listen_fd_ = -1;
    unlink(options_.path.c_str());
  }
  if (wake_fd_ >= 0) close(wake_fd_);
  wake_fd_ = -1;
}

void FastChannelServer::Reap() {
  std::list<std::unique_ptr<Conn>> ended;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if ((*it)->done.load()) {
        ended.splice(ended.end(), conns_, it++);
      } else {
        ++it;
      }
    }
  }
  for (auto& conn : ended) conn->thread.join();
}

void FastChannelServer::AcceptLoop() {
  while (!stopping_.load()) {
    pollfd pfds[2] = {{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    int rc = poll(pfds, 2, kReapEveryMs);
    if (rc < 0 && errno != EINTR) {
      Logger("client").error("fast channel poll: {}", std::strerror(errno));
      return;
    }
    if (stopping_.load()) return;
    Reap();
    if ((pfds[1].revents & POLLIN) != 0) Accept();
  }
}

void FastChannelServer::Accept() {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;  // EAGAIN, or a transient error (EMFILE...): try at the next wakeup
    auto conn = std::make_unique<Conn>();
    conn->fd = fd;
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      close(fd);
      continue;
    }
    conn->uid = cred.uid;
    absl::MutexLock lock(&mu_);
    int open = 0;
    int same_uid = 0;
    for (const auto& other : conns_) {
      if (other->done.load()) continue;
      ++open;
      same_uid += other->uid == conn->uid ? 1 : 0;
    }
    const char* refused = nullptr;
    const char* why = nullptr;
    if (open >= options_.max_connections) {
      refused = "limit";
      why = "too many fast-channel connections (--store_fast_max_connections)";
    } else if (same_uid >= options_.max_connections_per_uid) {
      refused = "uid_limit";
      why =
          "too many fast-channel connections of this uid "
          "(--store_fast_max_connections_per_uid)";
    } else if (SizeSendBuffer(fd, max_message_bytes_) < max_message_bytes_) {
      refused = "limit";  // the kernel gave this socket less than it gave the probe
      why = "the fast channel could not size this connection's send buffer";
    }
    if (refused != nullptr) {
      dispatch_->CountRefused(refused);  // before the answer: whoever reads it sees the count
      SendRefusal(fd, 8, why);
      close(fd);
      continue;
    }
    Conn* raw = conn.get();
    live_.fetch_add(1);
    try {
      raw->thread = std::thread([this, raw] { Serve(raw); });
    } catch (const std::system_error& e) {
      live_.fetch_sub(1);
      dispatch_->CountRefused("limit");
      close(fd);
      MC_LOG_EVERY(std::chrono::seconds(10), Logger("client"), warn,
                   "fast channel: no thread for a connection: {}", e.what());
      continue;
    }
    conns_.push_back(std::move(conn));
  }
}

bool FastChannelServer::WaitReadable(int fd, int timeout_ms, bool* hung_up) {
  const int64_t deadline = timeout_ms < 0 ? -1 : NowMs() + timeout_ms;
  for (;;) {
    const int wait = deadline < 0 ? -1 : static_cast<int>(std::max<int64_t>(0, deadline - NowMs()));
    pollfd pfds[2] = {{fd, POLLIN | POLLRDHUP, 0}, {wake_fd_, POLLIN, 0}};
    int rc = poll(pfds, 2, wait);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0 || stopping_.load() || pfds[1].revents != 0) return false;
    if (rc == 0) {
      dispatch_->CountRefused("timeout");
      return false;
    }
    // Data first: a peer may send its last call and close at once.
    *hung_up = (pfds[0].revents & (POLLRDHUP | POLLHUP)) != 0;
    return (pfds[0].revents & POLLIN) != 0;
  }
}

void FastChannelServer::Serve(Conn* conn) {
  FastConnection state;
  state.peer_uid = conn->uid;
  std::unique_ptr<char[]> buffer(new char[max_message_bytes_]);
  std::unique_ptr<char[]> block(new char[kArenaBlockBytes]);
  google::protobuf::ArenaOptions arena_options;
  arena_options.initial_block = block.get();
  arena_options.initial_block_size = kArenaBlockBytes;
  google::protobuf::Arena arena(arena_options);
  std::string reply;
  const int64_t first_deadline = NowMs() + options_.first_message_timeout_ms;
  for (bool spoke = false;;) {
    const int64_t left = std::max<int64_t>(0, first_deadline - NowMs());
    bool hung_up = false;
    if (!WaitReadable(conn->fd, spoke ? -1 : static_cast<int>(left), &hung_up)) break;
    // MSG_TRUNC: the datagram's real length, even when it is longer than the buffer.
    ssize_t n = recv(conn->fd, buffer.get(), max_message_bytes_, MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0 || (n == 0 && hung_up)) break;  // the peer closed
    // (n == 0 from a live peer: an empty datagram, answered as malformed.)
    spoke = true;
    const bool keep =
        dispatch_->Handle(state, buffer.get(), static_cast<size_t>(n), &reply, &arena);
    // A peer that does not take its answer at once loses the connection.
    const bool sent = send(conn->fd, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL) ==
                      static_cast<ssize_t>(reply.size());
    arena.Reset();
    if (!keep || !sent) break;
  }
  close(conn->fd);
  live_.fetch_sub(1);
  conn->done.store(true);
}

}  // namespace mc::client
