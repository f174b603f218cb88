// TcpDataServer: the serving side of the tcp data plane. Listens on HOST:PORT and answers
// READ/WRITE frames (transfer/tcp/frame.h) against a SegmentTable.
//
// Bounds are checked (overflow-safe) before memory is touched; an out-of-range or unknown
// segment gets an error response (a WRITE's payload is drained first), the connection stays
// usable. WRITE payloads are received straight into segment memory and READ responses are sent
// straight from it (header + payload in one sendmsg). A malformed frame, or an op no handler
// serves, closes its connection and counts `mc_dataplane_malformed_frames_total`. Requests on a
// connection are processed in order; each connection has its own thread (fine for a handful of
// peers). Other components add ops with RegisterOpHandler() (e.g. the SSD tier's READ_DISK).
// Thread-safe: Start/Stop from one owner thread; RegisterOpHandler before Start.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "transfer/tcp/frame.h"
#include "transfer/tcp/socket_util.h"
#include "transfer/transfer_engine.h"

namespace mc::transfer::tcp {

struct TcpDataServerOptions {
  std::string listen_address = "0.0.0.0:0";  // HOST:PORT; port 0 picks a free port
  int socket_buffer_bytes = 8 << 20;         // SO_SNDBUF / SO_RCVBUF
  uint64_t max_frame_length = kDefaultMaxFrameLength;
  MetricsRegistry* metrics = nullptr;  // optional; the malformed-frame counter lives here
};

// The blocking I/O of one server connection, handed to op handlers for the current request.
class ServerStream {
 public:
  explicit ServerStream(int fd) : fd_(fd) {}
  int fd() const { return fd_; }
  // Exactly `length` bytes of the request payload into `data`.
  absl::Status ReadExact(void* data, uint64_t length);
  // Discards `length` bytes of the request payload.
  absl::Status Skip(uint64_t length);
  // The response to `request`: header with `code` and the payload of `payload` (sum of lengths).
  absl::Status Respond(const FrameHeader& request, Code code, std::span<const iovec> payload = {});

 private:
  const int fd_;
};

// Serves one request whose header is decoded and valid. The handler must consume exactly the
// request's payload and send exactly one response; a non-OK return closes the connection.
using OpHandler = std::function<absl::Status(const FrameHeader& request, ServerStream& stream)>;

class TcpDataServer {
 public:
  TcpDataServer(TcpDataServerOptions options, SegmentTable& segments);
  ~TcpDataServer();  // Stop()s
  TcpDataServer(const TcpDataServer&) = delete;
  TcpDataServer& operator=(const TcpDataServer&) = delete;

  // Serves `op` (a FrameOp other than READ/WRITE, or to replace them). Before Start() only.
  absl::Status RegisterOpHandler(FrameOp op, OpHandler handler);

  absl::Status Start();
  // The bound "HOST:PORT" (after Start).
  const std::string& endpoint() const { return endpoint_; }
  // Closes the listener and every connection, joins all threads. Idempotent.
  void Stop();

  uint64_t malformed_frames() const { return malformed_->Value(); }

 private:
  struct Conn {
    UniqueFd fd;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  void AcceptLoop();
  void ServeConnection(Conn* conn);
  absl::Status ServeOne(ServerStream& stream, bool* closed);
  absl::Status HandleRead(const FrameHeader& request, ServerStream& stream);
  absl::Status HandleWrite(const FrameHeader& request, ServerStream& stream);
  void ReapFinished() ABSL_LOCKS_EXCLUDED(mu_);

  const TcpDataServerOptions options_;
  SegmentTable& segments_;
  std::unique_ptr<Counter> own_malformed_;  // used when options_.metrics is null
  Counter* malformed_;
  absl::flat_hash_map<uint16_t, OpHandler> handlers_;  // fixed once started
  std::string endpoint_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd that wakes the accept loop on Stop()
  std::thread accept_thread_;
  bool started_ = false;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<std::unique_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mc::transfer::tcp
