#include "master/master_lane.h"

#include <google/protobuf/arena.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/util.h"

namespace mc::master {
namespace {

namespace v1 = mcstore::v1;

void SetTimeouts(int fd, int64_t ms) {
  timeval tv{.tv_sec = ms / 1000, .tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

absl::StatusOr<int> Listen(const std::string& listen, int* bound_port) {
  absl::StatusOr<HostPort> hp = ParseHostPort(listen);
  if (!hp.ok()) return hp.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(hp->port);
  if (getaddrinfo(hp->host.empty() ? nullptr : hp->host.c_str(), port.c_str(), &hints, &res) != 0 ||
      res == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("master lane: cannot resolve ", listen));
  }
  const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool ok = fd >= 0 && bind(fd, res->ai_addr, res->ai_addrlen) == 0 && ::listen(fd, 128) == 0;
  freeaddrinfo(res);
  if (!ok) {
    const int err = errno;
    if (fd >= 0) close(fd);
    return absl::UnavailableError(
        absl::StrCat("master lane: cannot listen on ", listen, ": ", strerror(err)));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *bound_port = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                                 : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return fd;
}

// The first block of each call's arena, kept by the connection: a call of a few keys allocates
// nothing for its request and response messages.
constexpr size_t kArenaBlockBytes = 16 << 10;

// One served call: parse the body on `arena`, answer through the service's front door.
template <typename Req, typename Resp>
void Answer(grpc::Status (MasterGrpcService::*entry)(const CallCredentials&, const Req&, Resp*,
                                                     std::string*),
            MasterGrpcService& service, const lane::Request& request,
            const CallCredentials& credentials, google::protobuf::Arena& arena, std::string* out) {
  Req* req = google::protobuf::Arena::CreateMessage<Req>(&arena);
  if (!req->ParseFromString(request.body)) {
    lane::AppendReply(grpc::StatusCode::INVALID_ARGUMENT, request.call_id,
                      "unparsable lane request body", "", nullptr, out);
    return;
  }
  Resp* resp = google::protobuf::Arena::CreateMessage<Resp>(&arena);
  std::string leader;
  const grpc::Status s = (service.*entry)(credentials, *req, resp, &leader);
  lane::AppendReply(s.error_code(), request.call_id, s.error_message(), leader, resp, out);
}

// The peer's IP address as bytes (IPv4 or IPv6; an IPv4 peer on a dual-stack listener is its
// mapped IPv6 address, the same for each of its connections).
std::string PeerAddress(const sockaddr_storage& peer) {
  if (peer.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(peer).sin_addr;
    return std::string(reinterpret_cast<const char*>(&a), sizeof(a));
  }
  if (peer.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(peer).sin6_addr;
    return std::string(reinterpret_cast<const char*>(&a), sizeof(a));
  }
  return {};
}

}  // namespace

MasterLane::MasterLane(MasterLaneOptions options, MasterGrpcService& service,
                       MetricsRegistry& metrics)
    : options_(std::move(options)),
      service_(service),
      connections_gauge_(
          metrics.GetGauge("mc_master_lane_connections", "Open master lane connections")),
      refused_full_(metrics.GetCounter("mc_master_lane_refused_total",
                                       "Master lane connections closed by the lane",
                                       {{"reason", "max_connections"}})),
      refused_per_address_(metrics.GetCounter("mc_master_lane_refused_total",
                                              "Master lane connections closed by the lane",
                                              {{"reason", "per_address"}})),
      refused_malformed_(metrics.GetCounter("mc_master_lane_refused_total",
                                            "Master lane connections closed by the lane",
                                            {{"reason", "malformed"}})),
      closed_idle_(metrics.GetCounter("mc_master_lane_refused_total",
                                      "Master lane connections closed by the lane",
                                      {{"reason", "idle"}})),
      refused_handshake_(metrics.GetCounter("mc_master_lane_refused_total",
                                            "Master lane connections closed by the lane",
                                            {{"reason", "handshake"}})) {}

MasterLane::~MasterLane() { Stop(); }

absl::StatusOr<int> MasterLane::Start() {
  if (options_.tls.enabled()) {
    MC_ASSIGN_OR_RETURN(tls_, lane::TlsContext::ForServer(options_.tls));
  }
  int port = 0;
  absl::StatusOr<int> fd = Listen(options_.listen, &port);
  if (!fd.ok()) return fd.status();
  listen_fd_ = *fd;
  wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) return absl::InternalError("master lane: eventfd failed");
  acceptor_ = std::thread([this] { AcceptLoop(); });
  return port;
}

void MasterLane::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{.fd = listen_fd_, .events = POLLIN, .revents = 0},
                     {.fd = wake_fd_, .events = POLLIN, .revents = 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof(peer);
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &peer_len, SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of fds (EMFILE, ENFILE) leaves the connection pending and the listener readable:
      // wait a moment (or for Stop) instead of spinning. A peer that went away: try again.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        pollfd wake{.fd = wake_fd_, .events = POLLIN, .revents = 0};
        poll(&wake, 1, 50);
      }
      continue;
    }
    const std::string address = PeerAddress(peer);
    absl::MutexLock lock(&mu_);
    ReapLocked();
    if (stopping_) {
      close(fd);  // closed without a greeting, which the daemon reads as not connected
      continue;
    }
    if (connections_.size() >= options_.max_connections) {
      Refuse(fd, refused_full_);
      continue;
    }
    size_t& from_address = per_address_[address];
    if (from_address >= options_.max_connections_per_address) {
      Refuse(fd, refused_per_address_);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    SetTimeouts(fd, options_.idle_timeout_ms);
    const uint64_t id = next_id_++;
    Connection& c = connections_[id];
    c.fd = fd;
    c.address = address;
    ++from_address;
    try {
      c.thread = std::thread([this, id, fd] { Serve(id, fd); });
    } catch (const std::system_error& e) {
      // Out of threads (RLIMIT_NPROC, a cgroup's pids.max, memory) below max_connections: this
      // connection is refused like one over the bound (no greeting: the daemon reads that as
      // not connected and uses gRPC), never a crash of the master.
      connections_.erase(id);
      if (--from_address == 0) per_address_.erase(address);
      close(fd);
      refused_full_.Inc();
      MC_LOG_EVERY(std::chrono::seconds(10), Logger("master"), warn,
                   "master lane: no thread for a connection ({}); it goes over gRPC", e.what());
      continue;
    }
    connections_gauge_.Set(static_cast<int64_t>(connections_.size()));
  }
}

void MasterLane::Refuse(int fd, Counter& reason) {
  reason.Inc();  // counted before the peer can see the greeting
  // Plaintext: the greeting "full", then closed; the daemon sends nothing on it (a fresh
  // socket's send buffer takes the few bytes at once; MSG_DONTWAIT keeps a stuck peer from
  // holding accept). TLS: no greeting can go before the handshake, so it is closed at once; the
  // daemon's handshake fails and it sends nothing either.
  if (tls_ == nullptr) {
    const std::string full = lane::Greeting(lane::kFull, IdleTimeoutMs());
    (void)!send(fd, full.data(), full.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  close(fd);
}

void MasterLane::Serve(uint64_t id, int fd) {
  // OpenSSL writes with write(), not send(MSG_NOSIGNAL): a peer gone mid-write must fail the
  // write, not raise SIGPIPE (this thread's only; the daemons ignore it anyway).
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  std::unique_ptr<lane::Stream> stream;
  if (tls_ != nullptr) {
    absl::StatusOr<std::unique_ptr<lane::Stream>> s =
        tls_->Accept(fd, options_.handshake_timeout_ms);
    if (s.ok()) {
      stream = std::move(*s);
    } else {
      refused_handshake_.Inc();
      MC_LOG_EVERY(std::chrono::seconds(10), Logger("master"), warn, "master lane: {}",
                   s.status().ToString());
    }
  } else {
    stream = std::make_unique<lane::Stream>(fd, nullptr);
  }
  if (stream != nullptr) ServeStream(*stream);
  stream.reset();
  absl::MutexLock lock(&mu_);
  close(fd);
  auto it = connections_.find(id);
  if (it == connections_.end()) return;  // Stop() took it and joins this thread
  it->second.fd = -1;
  auto from = per_address_.find(it->second.address);
  if (from != per_address_.end() && --from->second == 0) per_address_.erase(from);
  ended_.push_back(id);
  connections_gauge_.Set(static_cast<int64_t>(connections_.size() - ended_.size()));
}

void MasterLane::ServeStream(lane::Stream& stream) {
  const lane::ReadExactly read = stream.Reader();
  // Kept across the connection's calls (docs/architecture.md, "The master lane").
  lane::Request request;
  std::string out;
  const std::unique_ptr<char[]> arena_block(new char[kArenaBlockBytes]);
  google::protobuf::ArenaOptions arena_options;
  arena_options.initial_block = arena_block.get();
  arena_options.initial_block_size = kArenaBlockBytes;
  // Ready: the daemon sends its first request only after reading this.
  bool serving = stream.WriteAll(lane::Greeting(lane::kReady, IdleTimeoutMs()));
  while (serving) {
    absl::Status s = lane::ReadRequest(read, options_.max_body_bytes, &request);
    out.clear();
    if (absl::IsUnavailable(s)) {
      if (stream.timed_out()) closed_idle_.Inc();
      break;
    }
    if (!s.ok()) {  // malformed: answered, then closed (the stream cannot be trusted further)
      refused_malformed_.Inc();
      const std::string why(s.message());
      lane::AppendReply(static_cast<uint32_t>(s.code()), request.call_id, why, "", nullptr, &out);
      stream.WriteAll(out);
      break;
    }
    {
      google::protobuf::Arena arena(arena_options);  // frees only what outgrew the block
      Dispatch(request, arena, &out);
    }
    serving = stream.WriteAll(out);
    lane::TrimBuffer(out);
    lane::TrimBuffer(request.body);
  }
  stream.Shutdown();
}

void MasterLane::Dispatch(const lane::Request& request, google::protobuf::Arena& arena,
                          std::string* out) {
  CallCredentials credentials;
  if (!request.credential.empty()) credentials.session = request.credential;
  switch (request.method) {
    case lane::kGetReplicas:
      return Answer(&MasterGrpcService::LaneGetReplicas, service_, request, credentials, arena,
                    out);
    case lane::kReleaseLeases:
      return Answer(&MasterGrpcService::LaneReleaseLeases, service_, request, credentials, arena,
                    out);
    case lane::kPutStart:
      return Answer(&MasterGrpcService::LanePutStart, service_, request, credentials, arena, out);
    case lane::kPutEnd:
      return Answer(&MasterGrpcService::LanePutEnd, service_, request, credentials, arena, out);
    case lane::kPutRevoke:
      return Answer(&MasterGrpcService::LanePutRevoke, service_, request, credentials, arena, out);
    case lane::kExist:
      return Answer(&MasterGrpcService::LaneExist, service_, request, credentials, arena, out);
    case lane::kRemove:
      return Answer(&MasterGrpcService::LaneRemove, service_, request, credentials, arena, out);
    default:
      lane::AppendReply(
          grpc::StatusCode::UNIMPLEMENTED, request.call_id,
          absl::StrCat("method ", request.method, " is not served over the master lane (use gRPC)"),
          "", nullptr, out);
  }
}

void MasterLane::ReapLocked() {
  for (uint64_t id : ended_) {
    auto it = connections_.find(id);
    if (it == connections_.end()) continue;
    if (it->second.thread.joinable()) it->second.thread.join();  // it is past its last lock
    connections_.erase(it);
  }
  ended_.clear();
}

void MasterLane::Stop() {
  std::map<uint64_t, Connection> connections;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  if (acceptor_.joinable()) acceptor_.join();
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, c] : connections_) {
      if (c.fd >= 0) shutdown(c.fd, SHUT_RDWR);  // wakes its recv; its thread closes it
    }
    connections.swap(connections_);
    ended_.clear();
    per_address_.clear();
  }
  for (auto& [id, c] : connections) {
    if (c.thread.joinable()) c.thread.join();
  }
  connections_gauge_.Set(0);
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  listen_fd_ = wake_fd_ = -1;
}

size_t MasterLane::ConnectionsForTest() {
  absl::MutexLock lock(&mu_);
  return connections_.size() - ended_.size();
}

}  // namespace mc::master
