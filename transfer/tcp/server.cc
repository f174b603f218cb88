#include "transfer/tcp/server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace mc::transfer::tcp {
namespace {

spdlog::logger& Log() {
  static spdlog::logger& log = Logger("transfer");
  return log;
}

}  // namespace

absl::Status ServerStream::ReadExact(void* data, uint64_t length) {
  return RecvAll(fd_, data, length);
}

absl::Status ServerStream::Skip(uint64_t length) { return SkipBytes(fd_, length); }

absl::Status ServerStream::Respond(const FrameHeader& request, Code code,
                                   std::span<const iovec> payload) {
  uint64_t total = 0;
  std::vector<iovec> iov;
  iov.reserve(payload.size() + 1);
  FrameBytes header{};
  iov.push_back({header.data(), header.size()});
  for (const iovec& v : payload) {
    total += v.iov_len;
    iov.push_back(v);
  }
  EncodeFrameHeader(MakeResponse(request, code, total), header.data());
  return SendAll(fd_, iov.data(), static_cast<int>(iov.size()));
}

TcpDataServer::TcpDataServer(TcpDataServerOptions options, SegmentTable& segments)
    : options_(std::move(options)), segments_(segments) {
  if (options_.metrics != nullptr) {
    malformed_ = &options_.metrics->GetCounter(
        "mc_dataplane_malformed_frames_total",
        "Data-plane frames rejected as malformed (their connection was closed).");
  } else {
    own_malformed_ = std::make_unique<Counter>();
    malformed_ = own_malformed_.get();
  }
  handlers_[static_cast<uint16_t>(FrameOp::kRead)] = [this](const FrameHeader& h,
                                                           ServerStream& s) {
    return HandleRead(h, s);
  };
  handlers_[static_cast<uint16_t>(FrameOp::kWrite)] = [this](const FrameHeader& h,
                                                            ServerStream& s) {
    return HandleWrite(h, s);
  };
}

TcpDataServer::~TcpDataServer() { Stop(); }

absl::Status TcpDataServer::RegisterOpHandler(FrameOp op, OpHandler handler) {
  if (started_) return McError(Code::kInternal, "RegisterOpHandler after Start");
  handlers_[static_cast<uint16_t>(op)] = std::move(handler);
  return absl::OkStatus();
}

absl::Status TcpDataServer::Start() {
  if (started_) return McError(Code::kInternal, "data server already started");
  auto fd = ListenTcp(options_.listen_address, options_.socket_buffer_bytes, &endpoint_);
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
    for (auto& c : conns_) ::shutdown(c->fd.get(), SHUT_RDWR);  // unblocks recv/send
    conns.swap(conns_);
  }
  const uint64_t one = 1;
  if (::write(wake_fd_.get(), &one, sizeof(one)) < 0) {
    Log().warn("data-plane server: wake write failed");
  }
  accept_thread_.join();
  for (auto& c : conns) c->thread.join();
  listen_fd_.reset();
  Log().info("data-plane server on {} stopped", endpoint_);
}

void TcpDataServer::ReapFinished() {
  std::list<std::unique_ptr<Conn>> finished;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if ((*it)->done.load()) {
        finished.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : finished) c->thread.join();
}

void TcpDataServer::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
    const int rc = ::poll(fds, 2, 1000);
    if (fds[1].revents != 0) return;  // Stop()
    ReapFinished();
    if (rc <= 0 || (fds[0].revents & POLLIN) == 0) continue;
    UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd.valid()) continue;
    TuneSocket(fd.get(), options_.socket_buffer_bytes);
    auto conn = std::make_unique<Conn>();
    conn->fd = std::move(fd);
    Conn* raw = conn.get();
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    conns_.push_back(std::move(conn));
    raw->thread = std::thread([this, raw] { ServeConnection(raw); });
  }
}

void TcpDataServer::ServeConnection(Conn* conn) {
  ServerStream stream(conn->fd.get());
  bool closed = false;
  while (!closed) {
    if (absl::Status s = ServeOne(stream, &closed); !s.ok()) {
      MC_LOG_EVERY(std::chrono::seconds(1), Log(), warn, "data-plane connection closed: {}",
                   std::string(s.message()));
      break;
    }
  }
  ::shutdown(conn->fd.get(), SHUT_RDWR);
  conn->done.store(true);
}

// One request: header, validation, dispatch. `closed` is set on a clean EOF between frames.
absl::Status TcpDataServer::ServeOne(ServerStream& stream, bool* closed) {
  uint8_t buf[kFrameHeaderSize];
  if (absl::Status s = RecvAll(stream.fd(), buf, sizeof(buf)); !s.ok()) {
    *closed = true;  // peer went away (or Stop()); not an error of the peer's frames
    return absl::OkStatus();
  }
  absl::StatusOr<FrameHeader> header = DecodeFrameHeader(buf, sizeof(buf), options_.max_frame_length);
  if (header.ok() && header->is_response()) {
    header = McError(Code::kInvalidArgument, "malformed frame: response sent to server");
  }
  auto it = header.ok() ? handlers_.find(header->base_op()) : handlers_.end();
  if (header.ok() && it == handlers_.end()) {
    header = McError(Code::kInvalidArgument, absl::StrCat("malformed frame: unserved op ", header->op));
  }
  if (!header.ok()) {
    malformed_->Inc();
    return header.status();
  }
  return it->second(*header, stream);
}

absl::Status TcpDataServer::HandleRead(const FrameHeader& request, ServerStream& stream) {
  absl::StatusOr<char*> mem = segments_.Resolve(request.segment_id, request.offset, request.length);
  if (!mem.ok()) return stream.Respond(request, ToCode(mem.status()));
  const iovec payload{*mem, request.length};
  return stream.Respond(request, Code::kOk, {&payload, 1});
}

absl::Status TcpDataServer::HandleWrite(const FrameHeader& request, ServerStream& stream) {
  absl::StatusOr<char*> mem = segments_.Resolve(request.segment_id, request.offset, request.length);
  if (!mem.ok()) {
    if (absl::Status s = stream.Skip(request.length); !s.ok()) return s;
    return stream.Respond(request, ToCode(mem.status()));
  }
  if (absl::Status s = stream.ReadExact(*mem, request.length); !s.ok()) return s;
  return stream.Respond(request, Code::kOk);
}

}  // namespace mc::transfer::tcp
