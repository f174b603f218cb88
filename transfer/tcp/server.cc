#include "transfer/tcp/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/status_macros.h"

namespace mc::transfer::tcp {

// The handler ops are the frame ops of the same value (DataRequest carries them across).
static_assert(static_cast<uint16_t>(DataOp::kRead) == static_cast<uint16_t>(FrameOp::kRead));
static_assert(static_cast<uint16_t>(DataOp::kWrite) == static_cast<uint16_t>(FrameOp::kWrite));
static_assert(static_cast<uint16_t>(DataOp::kReadDisk) ==
              static_cast<uint16_t>(FrameOp::kReadDisk));
static_assert(static_cast<uint16_t>(DataOp::kRdmaConnect) ==
              static_cast<uint16_t>(FrameOp::kRdmaConnect));
static_assert(static_cast<uint16_t>(DataOp::kIndex) == static_cast<uint16_t>(FrameOp::kIndex));

namespace {

spdlog::logger& Log() {
  static spdlog::logger& log = Logger("transfer");
  return log;
}

// The peer's IP address (no port), for the per-peer connection cap.
std::string PeerHost(const sockaddr_storage& addr, socklen_t len) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (len >= sizeof(sockaddr_in) && addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, host, sizeof(host));
  } else if (len >= sizeof(sockaddr_in6) && addr.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr, host,
              sizeof(host));
  }
  return host;
}

// Bounds every blocking recv/send on `fd` mid-frame (EAGAIN then closes the connection).
void SetIoTimeout(int fd, int64_t ms) {
  if (ms <= 0) return;
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// A served connection's receive buffer starts at the kernel's default and is raised to the floor
// only once the connection is admitted (authenticated, with keys): a socket that never completes
// its handshake cannot make the kernel hold a floor's worth of bytes for it.
SocketBuffers Unfloored(SocketBuffers buffers) {
  buffers.receive_floor_bytes = 0;
  return buffers;
}

// The handler's view of a decoded, valid request frame.
DataRequest ToDataRequest(const FrameHeader& header) {
  DataRequest r;
  r.op = static_cast<DataOp>(header.base_op());
  r.segment_id = header.segment_id;
  r.offset = header.offset;
  r.length = header.length;
  r.key_tag = r.op == DataOp::kReadDisk ? header.reserved : 0;
  r.payload_length = RequestPayloadLength(r.op, header.length);
  return r;
}

// One request's I/O on its connection: the payload from the socket, the response frame to it.
class TcpRequestStream final : public RequestStream {
 public:
  TcpRequestStream(BlockingChannel& channel, const FrameHeader& request, uint64_t payload_length)
      : RequestStream(payload_length), channel_(channel), request_(request) {}

 private:
  absl::Status DoReadExact(void* data, uint64_t length) override {
    return channel_.ReadExact(data, length);
  }
  absl::Status DoSkip(uint64_t length) override { return channel_.Skip(length); }
  // Header + payload in one sendmsg (plaintext), or sealed: the header's record, then the
  // payload's.
  absl::Status DoRespond(Code code, std::span<const iovec> payload) override {
    uint64_t total = 0;
    for (const iovec& v : payload) total += v.iov_len;
    FrameBytes header{};
    EncodeFrameHeader(MakeResponse(request_, code, total), header.data());
    const iovec head{header.data(), header.size()};
    return channel_.Send(&head, 1, payload.data(), payload.size());
  }

  BlockingChannel& channel_;
  const FrameHeader& request_;
};

}  // namespace

TcpDataServer::TcpDataServer(TcpDataServerOptions options, SegmentTable& segments)
    : options_(std::move(options)), segments_(segments) {
  MetricsRegistry* m = options_.metrics;
  if (m == nullptr) {
    own_metrics_ = std::make_unique<MetricsRegistry>();
    m = own_metrics_.get();
  }
  malformed_ =
      &m->GetCounter("mc_dataplane_malformed_frames_total",
                     "Data-plane frames rejected as malformed (their connection was closed).");
  accept_errors_ =
      &m->GetCounter("mc_dataplane_accept_errors_total",
                     "Data-plane accept() failures (e.g. EMFILE at the fd limit); each backs off.");
  rejected_ = &m->GetCounter("mc_dataplane_connections_rejected_total",
                             "Data-plane connections closed at once: over the total or "
                             "per-peer connection cap.");
  pending_evicted_ = &m->GetCounter(
      "mc_dataplane_pending_evicted_total",
      "Data-plane connections still in the handshake closed to make room for a newer one "
      "(the pending budget, --data_max_pending_connections, was full).");
  pending_per_peer_evicted_ =
      &m->GetCounter("mc_dataplane_pending_per_peer_evicted_total",
                     "Data-plane connections still in the handshake closed because their address "
                     "opened another one with --data_max_pending_per_peer already pending.");
  idle_closed_ = &m->GetCounter("mc_dataplane_connections_timed_out_total",
                                "Data-plane connections closed for idleness or a stalled frame.");
  open_gauge_ = &m->GetGauge("mc_dataplane_connections", "Open data-plane server connections");
  unknown_read_ = &m->GetCounter(kUnknownSegmentMetric, kUnknownSegmentHelp, {{"op", "read"}});
  tampered_ = &m->GetCounter(
      "mc_dataplane_tampered_connections_total",
      "Encrypted data-plane connections closed because a record failed its authentication tag "
      "(or announced an impossible length): altered, replayed, reordered or injected bytes.");
  encrypted_ = &m->GetCounter("mc_dataplane_encrypted_connections_total",
                              "Data-plane connections that passed the handshake encrypted.");
  unknown_write_ = &m->GetCounter(kUnknownSegmentMetric, kUnknownSegmentHelp, {{"op", "write"}});
  for (int r = 0; r < static_cast<int>(HandshakeFailure::kCount); ++r) {
    auth_failures_[r] = &m->GetCounter(
        "mc_data_auth_failures_total",
        "Data-plane connections closed because the handshake failed, by reason.",
        {{"reason", std::string(HandshakeFailureName(static_cast<HandshakeFailure>(r)))}});
  }
  for (int r = 0; r < static_cast<int>(auth::Denial::kCount); ++r) {
    denials_[r] =
        &m->GetCounter(kCapabilityDeniedMetric, kCapabilityDeniedHelp,
                       {{"reason", std::string(auth::DenialName(static_cast<auth::Denial>(r)))}});
  }
  handlers_[static_cast<uint16_t>(DataOp::kRead)] = [this](const DataRequest& r, RequestStream& s) {
    return HandleRead(r, s);
  };
  handlers_[static_cast<uint16_t>(DataOp::kWrite)] =
      [this](const DataRequest& r, RequestStream& s) { return HandleWrite(r, s); };
}

TcpDataServer::~TcpDataServer() { Stop(); }

absl::Status TcpDataServer::RegisterOpHandler(DataOp op, DataOpHandler handler) {
  if (started_) return McError(Code::kInternal, "RegisterOpHandler after Start");
  handlers_[static_cast<uint16_t>(op)] = std::move(handler);
  return absl::OkStatus();
}

absl::Status TcpDataServer::Start() {
  if (started_) return McError(Code::kInternal, "data server already started");
  if (options_.cluster_keys != nullptr && options_.capabilities == nullptr) {
    return McError(Code::kInternal, "data server: cluster keys without a capability verifier");
  }
  auto fd = ListenTcp(options_.listen_address, Unfloored(options_.socket_buffers), &endpoint_);
  if (!fd.ok()) return fd.status();
  listen_fd_ = std::move(*fd);
  wake_fd_.reset(eventfd(0, EFD_CLOEXEC));
  if (!wake_fd_.valid()) return McError(Code::kInternal, "eventfd failed");
  started_ = true;
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  Log().info("data-plane server listening on {}", endpoint_);
  return absl::OkStatus();
}

void TcpDataServer::Stop() {
  std::list<std::unique_ptr<Conn>> conns;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || !started_) return;
    stopping_ = true;
    per_peer_.clear();
    pending_.clear();
    pending_per_peer_.clear();
    authenticated_ = 0;
    open_gauge_->Add(-static_cast<int64_t>(conns_.size()));
    for (auto& c : conns_) ::shutdown(c->fd.get(), SHUT_RDWR);  // unblocks recv/send
    conns.swap(conns_);
  }
  const uint64_t one = 1;
  if (::write(wake_fd_.get(), &one, sizeof(one)) < 0) {
    Log().warn("data-plane server: wake write failed");
  }
  accept_thread_.join();
  for (auto& c : conns) {
    if (c->thread.joinable()) c->thread.join();
  }
  listen_fd_.reset();
  Log().info("data-plane server on {} stopped", endpoint_);
}

void TcpDataServer::ReapFinished() {
  std::list<std::unique_ptr<Conn>> finished;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if ((*it)->done.load()) {
        LeavePending(**it);
        if ((*it)->admitted) {
          auto peer = per_peer_.find((*it)->peer);
          if (peer != per_peer_.end() && --peer->second <= 0) per_peer_.erase(peer);
          --authenticated_;
        }
        open_gauge_->Add(-1);
        finished.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : finished) {
    if (c->thread.joinable()) c->thread.join();  // not when no thread could be started
  }
}

bool TcpDataServer::WaitForStop(int64_t ms) {
  pollfd wake{wake_fd_.get(), POLLIN, 0};
  return ::poll(&wake, 1, static_cast<int>(ms)) > 0;
}

size_t TcpDataServer::connection_count() const {
  absl::MutexLock lock(&mu_);
  return conns_.size();
}

absl::Status TcpDataServer::Health() const {
  const int64_t failed_ms = last_accept_error_ms_.load();
  if (failed_ms == 0) return absl::OkStatus();
  const int64_t ago = RealClock::Get().NowMs() - failed_ms;
  if (ago > options_.unhealthy_after_accept_error_ms) return absl::OkStatus();
  return McError(Code::kUnavailable,
                 absl::StrCat("data plane: accept() failing (", std::strerror(last_accept_errno_),
                              ", last ", ago, " ms ago)"));
}

void TcpDataServer::AcceptLoop() {
  int64_t backoff_ms = 0;
  while (true) {
    pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
    const int rc = ::poll(fds, 2, 1000);
    if (fds[1].revents != 0) return;  // Stop()
    ReapFinished();
    if (rc <= 0 || (fds[0].revents & POLLIN) == 0) continue;
    sockaddr_storage addr{};
    socklen_t addr_len = sizeof(addr);
    UniqueFd fd(
        ::accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), &addr_len, SOCK_CLOEXEC));
    if (!fd.valid()) {
      const int err = errno;
      if (err == EINTR || err == EAGAIN || err == ECONNABORTED) continue;
      // EMFILE/ENFILE/ENOBUFS/ENOMEM: the pending connection stays queued and poll() keeps
      // reporting it; retrying at once would spin. Back off (Stop() still wakes us).
      accept_errors_->Inc();
      last_accept_errno_ = err;
      last_accept_error_ms_ = std::max<int64_t>(RealClock::Get().NowMs(), 1);
      backoff_ms =
          std::min<int64_t>(backoff_ms == 0 ? 10 : backoff_ms * 2, options_.max_accept_backoff_ms);
      MC_LOG_EVERY(std::chrono::seconds(5), Log(), err,
                   "data-plane accept on {} failed: {} (backing off {} ms)", endpoint_,
                   std::strerror(err), backoff_ms);
      if (WaitForStop(backoff_ms)) return;
      continue;
    }
    backoff_ms = 0;
    last_accept_error_ms_ = 0;
    const std::string peer = PeerHost(addr, addr_len);
    TuneSocket(fd.get(), Unfloored(options_.socket_buffers));
    SetIoTimeout(fd.get(), options_.io_timeout_ms);
    auto conn = std::make_unique<Conn>();
    conn->fd = std::move(fd);
    conn->peer = peer;
    Conn* raw = conn.get();
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    if (options_.cluster_keys != nullptr) {
      // Not authenticated yet: the pending budget only (docs/security.md).
      if (pending_per_peer_[peer] >= options_.max_pending_per_peer) {
        // This address's oldest pending connection makes room: one address never holds more
        // than its share, and a burst of a real peer's pool only loses a handshake that took
        // longer than max_pending_per_peer newer connections took to arrive.
        auto oldest = std::find_if(pending_.begin(), pending_.end(),
                                   [&peer](const Conn* c) { return c->peer == peer; });
        if (oldest != pending_.end()) {
          Conn* victim = *oldest;
          ::shutdown(victim->fd.get(), SHUT_RDWR);
          LeavePending(*victim);
          pending_per_peer_evicted_->Inc();
          MC_LOG_EVERY(std::chrono::seconds(5), Log(), warn,
                       "data-plane connections from {} still in the handshake at the cap ({}): "
                       "the oldest closed",
                       peer, options_.max_pending_per_peer);
        }
      }
      if (static_cast<int>(pending_.size()) >= options_.max_pending_connections) {
        Conn* oldest = pending_.front();
        ::shutdown(oldest->fd.get(), SHUT_RDWR);  // its handshake fails; its thread ends
        LeavePending(*oldest);
        pending_evicted_->Inc();
        MC_LOG_EVERY(std::chrono::seconds(5), Log(), warn,
                     "data-plane pending connections at the cap ({}): the oldest, from {}, "
                     "closed for a new one from {}",
                     options_.max_pending_connections, oldest->peer, peer);
      }
      ++pending_per_peer_[peer];
      raw->pending = true;
      pending_.push_back(raw);
    } else {
      int& from_peer = per_peer_[peer];
      if (authenticated_ >= options_.max_connections ||
          from_peer >= options_.max_connections_per_peer) {
        if (from_peer == 0) per_peer_.erase(peer);
        rejected_->Inc();
        MC_LOG_EVERY(std::chrono::seconds(5), Log(), warn,
                     "data-plane connection from {} refused: {} open ({} from it), caps {} / {} "
                     "per peer",
                     peer, authenticated_, from_peer, options_.max_connections,
                     options_.max_connections_per_peer);
        continue;  // `conn` closes the socket
      }
      ++from_peer;
      ++authenticated_;
      raw->admitted = true;
    }
    open_gauge_->Add(1);
    conns_.push_back(std::move(conn));
    try {
      raw->thread = std::thread([this, raw] { ServeConnection(raw); });
    } catch (const std::system_error& e) {
      // Out of threads (the host's task limit, a cgroup's pids.max, memory): the connection is
      // closed and reaped like one that ended (the peer sees a lost connection and retries),
      // never an uncaught exception taking the daemon down.
      raw->done.store(true);
      rejected_->Inc();
      MC_LOG_EVERY(std::chrono::seconds(5), Log(), warn,
                   "data-plane connection from {} closed: no thread for it ({})", peer, e.what());
    }
  }
}

bool TcpDataServer::Authenticate(Conn& conn) {
  std::string detail;
  bool encrypted = false;
  SessionKeys session;
  const HandshakeFailure failure =
      ServerHandshake(conn.fd.get(), *options_.cluster_keys,
                      RealClock::Get().NowMs() + options_.handshake_timeout_ms, &detail,
                      options_.require_encryption, &encrypted, &session);
  if (failure == HandshakeFailure::kNone) {
    if (encrypted) {
      conn.channel = std::make_unique<BlockingChannel>(conn.fd.get(), &session, true);
      encrypted_->Inc();
    }
    return true;
  }
  auth_failures_[static_cast<int>(failure)]->Inc();
  MC_LOG_EVERY(std::chrono::seconds(5), Log(), warn,
               "data-plane connection from {} refused: handshake failed ({}: {})", conn.peer,
               HandshakeFailureName(failure), detail);
  return false;
}

void TcpDataServer::LeavePending(Conn& conn) {
  if (!conn.pending) return;
  conn.pending = false;
  pending_.remove(&conn);  // at most max_pending_connections entries
  auto it = pending_per_peer_.find(conn.peer);
  if (it != pending_per_peer_.end() && --it->second <= 0) pending_per_peer_.erase(it);
}

bool TcpDataServer::Admit(Conn& conn) {
  absl::MutexLock lock(&mu_);
  if (!conn.pending) return false;  // evicted for a newer one while it shook hands
  LeavePending(conn);
  int& from_peer = per_peer_[conn.peer];
  if (authenticated_ >= options_.max_connections ||
      from_peer >= options_.max_connections_per_peer) {
    if (from_peer == 0) per_peer_.erase(conn.peer);
    rejected_->Inc();
    MC_LOG_EVERY(std::chrono::seconds(5), Log(), warn,
                 "data-plane connection from {} refused: {} authenticated ({} from it), caps {} / "
                 "{} per peer",
                 conn.peer, authenticated_, from_peer, options_.max_connections,
                 options_.max_connections_per_peer);
    return false;
  }
  ++from_peer;
  ++authenticated_;
  conn.admitted = true;
  return true;
}

void TcpDataServer::ServeConnection(Conn* conn) {
  bool closed = options_.cluster_keys != nullptr && !(Authenticate(*conn) && Admit(*conn));
  if (!closed) ApplyReceiveFloor(conn->fd.get(), options_.socket_buffers);
  if (!closed && conn->channel == nullptr) {
    conn->channel = std::make_unique<BlockingChannel>(conn->fd.get(), nullptr, true);
  }
  while (!closed) {
    // Idle between requests: wait for the next header at most idle_timeout_ms (unless an opened
    // record still holds bytes of it).
    pollfd pfd{conn->fd.get(), POLLIN, 0};
    int rc = 1;
    while (conn->channel->buffered() == 0) {
      rc = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(options_.idle_timeout_ms, 1 << 30)));
      if (!(rc < 0 && errno == EINTR)) break;
    }
    if (rc == 0) {
      idle_closed_->Inc();
      MC_LOG_EVERY(std::chrono::seconds(5), Log(), info,
                   "data-plane connection from {} idle for {} ms: closed", conn->peer,
                   options_.idle_timeout_ms);
      break;
    }
    if (absl::Status s = ServeOne(*conn, &closed); !s.ok()) {
      MC_LOG_EVERY(std::chrono::seconds(1), Log(), warn, "data-plane connection closed: {}",
                   std::string(s.message()));
      break;
    }
  }
  if (conn->channel != nullptr && conn->channel->tampered()) {
    tampered_->Inc();
    MC_LOG_EVERY(std::chrono::seconds(5), Log(), warn,
                 "data-plane connection from {} closed: a record failed authentication",
                 conn->peer);
  }
  ::shutdown(conn->fd.get(), SHUT_RDWR);
  conn->done.store(true);
}

// One request: header, validation, dispatch. `closed` is set on a clean EOF between frames.
absl::Status TcpDataServer::ServeOne(Conn& conn, bool* closed) {
  uint8_t buf[kFrameHeaderSize];
  if (absl::Status s = conn.channel->ReadExact(buf, sizeof(buf)); !s.ok()) {
    *closed = true;  // peer went away (or Stop()); not an error of the peer's frames
    return absl::OkStatus();
  }
  absl::StatusOr<FrameHeader> header =
      DecodeFrameHeader(buf, sizeof(buf), options_.max_frame_length);
  if (header.ok() && header->is_response()) {
    header = McError(Code::kInvalidArgument, "malformed frame: response sent to server");
  }
  auto it = header.ok() ? handlers_.find(header->base_op()) : handlers_.end();
  if (header.ok() && it == handlers_.end()) {
    header =
        McError(Code::kInvalidArgument, absl::StrCat("malformed frame: unserved op ", header->op));
  }
  if (!header.ok()) {
    malformed_->Inc();
    return header.status();
  }
  const DataRequest request = ToDataRequest(*header);
  TcpRequestStream stream(*conn.channel, *header, request.payload_length);
  if (CarriesCapability(header->base_op())) {
    bool refused = false;
    MC_RETURN_IF_ERROR(CheckCapability(conn, *header, stream, &refused));
    if (refused) return stream.CheckFinished();
  }
  MC_RETURN_IF_ERROR(it->second(request, stream));
  return stream.CheckFinished();
}

absl::Status TcpDataServer::CheckCapability(Conn& conn, const FrameHeader& request,
                                            RequestStream& stream, bool* refused) {
  auth::CapabilityBytes cap;  // between the header and the payload, apart from the payload
  MC_RETURN_IF_ERROR(conn.channel->ReadExact(cap.data(), cap.size()));
  if (options_.cluster_keys == nullptr) return absl::OkStatus();  // --auth=false
  auth::FrameAccess access{
      .segment_id = request.segment_id, .offset = request.offset, .length = request.length};
  switch (static_cast<FrameOp>(request.base_op())) {
    case FrameOp::kWrite:
      access.right = auth::Right::kWrite;
      break;
    case FrameOp::kReadDisk:
      access.right = auth::Right::kReadDisk;
      access.key_tag = request.reserved;
      break;
    default:
      access.right = auth::Right::kRead;
      break;
  }
  const auth::Denial denial =
      options_.capabilities->Check(cap.data(), access, &conn.capability_cache);
  if (denial == auth::Denial::kNone) return absl::OkStatus();
  *refused = true;
  denials_[static_cast<int>(denial)]->Inc();
  MC_LOG_EVERY(std::chrono::seconds(5), Log(), warn,
               "data-plane frame from {} refused ({}): op {} segment {} offset {} length {}",
               conn.peer, auth::DenialName(denial), request.op, request.segment_id, request.offset,
               request.length);
  MC_RETURN_IF_ERROR(stream.Skip(stream.payload_left()));  // a WRITE's payload; 0 otherwise
  return stream.Respond(Code::kPermissionDenied);
}

absl::Status TcpDataServer::HandleRead(const DataRequest& request, RequestStream& stream) {
  absl::StatusOr<char*> mem = segments_.Resolve(request.segment_id, request.offset, request.length);
  if (!mem.ok()) {
    if (ToCode(mem.status()) == Code::kNotFound) unknown_read_->Inc();
    return stream.Respond(ToCode(mem.status()));
  }
  const iovec payload{*mem, request.length};
  return stream.Respond(Code::kOk, {&payload, 1});
}

absl::Status TcpDataServer::HandleWrite(const DataRequest& request, RequestStream& stream) {
  absl::StatusOr<char*> mem = segments_.Resolve(request.segment_id, request.offset, request.length);
  if (!mem.ok()) {
    if (ToCode(mem.status()) == Code::kNotFound) unknown_write_->Inc();
    if (absl::Status s = stream.Skip(request.length); !s.ok()) return s;
    return stream.Respond(ToCode(mem.status()));
  }
  if (absl::Status s = stream.ReadExact(*mem, request.length); !s.ok()) return s;
  return stream.Respond(Code::kOk);
}

}  // namespace mc::transfer::tcp
