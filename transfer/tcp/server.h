// TcpDataServer: the serving side of the tcp data plane, the DataServer (transfer/data_server.h)
// that peers reach. Listens on HOST:PORT and answers READ/WRITE frames (transfer/tcp/frame.h)
// against a SegmentTable; the handlers registered for other ops get each frame as a DataRequest
// (its header fields; a READ_DISK frame's reserved word as the key tag) and a RequestStream over
// the connection, so they depend on no tcp type. READ_DISK and INDEX are served only here.
//
// Bounds are checked (overflow-safe) before memory is touched; an out-of-range or unknown
// segment gets an error response (a WRITE's payload is drained first), the connection stays
// usable. WRITE payloads are received straight into segment memory and READ responses are sent
// straight from it (header + payload in one sendmsg). A malformed frame, or an op no handler
// serves, closes its connection and counts `mc_dataplane_malformed_frames_total`. Requests on a
// connection are processed in order; each connection has its own thread (fine for a handful of
// peers). Connections are capped (total and per peer IP), closed after an idle timeout between
// requests and after an I/O timeout mid-frame. accept() failures (fd exhaustion) back off
// exponentially instead of spinning, are counted (mc_dataplane_accept_errors_total) and make
// Health() report the data plane unhealthy until an accept succeeds again. Other components add ops
// with RegisterOpHandler() (e.g. the SSD tier's READ_DISK, the object index's INDEX); a handler
// that returns an error, reads past its frame's payload, leaves some of it unread or does not
// respond exactly once closes its connection (RequestStream keeps that contract).
// A READ/WRITE naming a segment id the table does not hold is answered NOT_FOUND and counted
// (mc_dataplane_unknown_segment_total{op}): a reader or writer of an earlier registration or
// master run, whose segment ids are gone (with authentication such a frame is usually refused
// first: its capability was minted under the earlier registration's key).
// Authentication (docs/security.md): with cluster keys, every connection must first pass the
// AUTH handshake (transfer/tcp/handshake.h) within handshake_timeout_ms, else it is closed and
// counted (mc_data_auth_failures_total{reason}); and every READ/WRITE/READ_DISK frame must carry
// a capability that the CapabilityVerifier accepts for exactly the bytes the frame names, else
// it is answered PERMISSION_DENIED (a WRITE's payload drained, never stored) and counted
// (mc_data_capability_denied_total{reason}); the connection stays usable. Without keys there is
// neither (--auth=false). With an encrypted connection (the handshake's choice; required with
// require_encryption) every frame after the handshake is in sealed records (sealed_records.h);
// a record that fails its tag closes the connection before any of its bytes is acted on or a
// WRITE acknowledged, counted (mc_dataplane_tampered_connections_total). Thread-safe: Start/Stop
// from one owner thread; RegisterOpHandler before Start.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/capability.h"
#include "common/metrics.h"
#include "transfer/data_server.h"
#include "transfer/tcp/frame.h"
#include "transfer/tcp/handshake.h"
#include "transfer/tcp/socket_util.h"
#include "transfer/transfer_engine.h"

namespace mc::transfer::tcp {

struct TcpDataServerOptions {
  std::string listen_address = "0.0.0.0:0";  // HOST:PORT; port 0 picks a free port
  // The data plane's default socket buffers (socket_util.h).
  SocketBuffers socket_buffers = kDataPlaneBuffers;
  uint64_t max_frame_length = kDefaultMaxFrameLength;
  MetricsRegistry* metrics = nullptr;  // optional; the counters and gauges live here
  // Connection limits of AUTHENTICATED connections (with keys: those that passed the handshake;
  // without: all): beyond them a new one is closed at once (and counted).
  int max_connections = 1024;
  int max_connections_per_peer = 256;  // per peer IP address
  // With keys, connections still in the handshake (pending) have their own, small budget, so
  // sockets that never speak cannot take what authenticated peers need: at most
  // max_pending_connections in all (a new one then closes the OLDEST pending one: a real peer
  // completes its handshake in a round trip, an idle socket would hold its slot for the whole
  // handshake_timeout_ms) and max_pending_per_peer from one IP address (beyond, that address's
  // oldest pending one is closed).
  int max_pending_connections = 128;
  int max_pending_per_peer = 32;
  // A connection with no request for this long is closed (peers' pools reconnect).
  int64_t idle_timeout_ms = 300'000;
  // A request (or response) stalled mid-frame for this long closes its connection.
  int64_t io_timeout_ms = 30'000;
  // Accept failures (EMFILE, ENFILE, ENOBUFS...) back off from 10 ms doubling up to this.
  int64_t max_accept_backoff_ms = 1000;
  // The data plane counts as unhealthy while accept() failed within this window with no
  // success since.
  int64_t unhealthy_after_accept_error_ms = 5000;
  // Authentication: null = none (no handshake, capabilities ignored). With keys, `capabilities`
  // (borrowed, must outlive the server) is required and checks every data frame.
  auth::ClusterKeysPtr cluster_keys;
  const auth::CapabilityVerifier* capabilities = nullptr;
  // The whole handshake (both round trips) must finish within this.
  int64_t handshake_timeout_ms = 5000;
  // With keys: refuse requesters that do not ask for an encrypted connection (sealed_records.h;
  // --data_encryption=on). Without, a requester's wish for encryption is still followed.
  bool require_encryption = false;
};

class TcpDataServer final : public DataServer {
 public:
  TcpDataServer(TcpDataServerOptions options, SegmentTable& segments);
  ~TcpDataServer() override;  // Stop()s
  TcpDataServer(const TcpDataServer&) = delete;
  TcpDataServer& operator=(const TcpDataServer&) = delete;

  // Serves `op` (one other than READ/WRITE, or to replace them). Before Start() only.
  absl::Status RegisterOpHandler(DataOp op, DataOpHandler handler) override;

  absl::Status Start() override;
  // The bound "HOST:PORT" (after Start).
  const std::string& endpoint() const override { return endpoint_; }
  // Closes the listener and every connection, joins all threads. Idempotent.
  void Stop() override;

  uint64_t malformed_frames() const { return malformed_->Value(); }
  uint64_t accept_errors() const { return accept_errors_->Value(); }
  uint64_t rejected_connections() const { return rejected_->Value(); }
  uint64_t auth_failures(HandshakeFailure reason) const {
    return auth_failures_[static_cast<int>(reason)]->Value();
  }
  uint64_t unknown_segment_frames() const {
    return unknown_read_->Value() + unknown_write_->Value();
  }
  uint64_t tampered_connections() const { return tampered_->Value(); }
  uint64_t encrypted_connections() const { return encrypted_->Value(); }
  uint64_t capability_denials(auth::Denial reason) const {
    return denials_[static_cast<int>(reason)]->Value();
  }
  size_t connection_count() const;
  // OK, or why the data plane cannot take connections now (accept failing recently).
  absl::Status Health() const override;

 private:
  struct Conn {
    UniqueFd fd;
    std::string peer;  // IP address, for the per-peer cap
    std::thread thread;
    std::atomic<bool> done{false};
    auth::CapabilityVerifier::Cache capability_cache;  // used by its own thread only
    // Its bytes after the handshake, plaintext or sealed records; its own thread only.
    std::unique_ptr<BlockingChannel> channel;
    // Guarded by the server's mu_: in pending_ (handshake not done), or counted as
    // authenticated (in per_peer_ and authenticated_).
    bool pending = false;
    bool admitted = false;
  };
  // Waits up to `ms` for Stop(); true when stopping.
  bool WaitForStop(int64_t ms);
  void AcceptLoop();
  void ServeConnection(Conn* conn);
  absl::Status ServeOne(Conn& conn, bool* closed);
  // With keys: the handshake; false closes the connection (counted, logged).
  bool Authenticate(Conn& conn);
  // A pending connection passed its handshake: counted as authenticated if the caps allow it
  // (false: refused, counted) and it was not evicted meanwhile.
  bool Admit(Conn& conn) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes `conn` out of the pending budget, if it is there.
  void LeavePending(Conn& conn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The capability block of a data-op request: reads it and, with keys, checks it. A refusal is
  // answered on `stream` (WRITE payload drained) and *refused set; a non-OK return closes the
  // connection.
  absl::Status CheckCapability(Conn& conn, const FrameHeader& request, RequestStream& stream,
                               bool* refused);
  absl::Status HandleRead(const DataRequest& request, RequestStream& stream);
  absl::Status HandleWrite(const DataRequest& request, RequestStream& stream);
  void ReapFinished() ABSL_LOCKS_EXCLUDED(mu_);

  const TcpDataServerOptions options_;
  SegmentTable& segments_;
  std::unique_ptr<MetricsRegistry> own_metrics_;  // used when options_.metrics is null
  Counter* malformed_;
  Counter* accept_errors_;
  Counter* rejected_;
  Counter* pending_evicted_;
  Counter* pending_per_peer_evicted_;
  Counter* idle_closed_;
  Gauge* open_gauge_;
  Counter* unknown_read_;
  Counter* unknown_write_;
  Counter* tampered_;
  Counter* encrypted_;
  std::array<Counter*, static_cast<int>(HandshakeFailure::kCount)> auth_failures_{};
  std::array<Counter*, static_cast<int>(auth::Denial::kCount)> denials_{};
  std::atomic<int64_t> last_accept_error_ms_{0};  // 0: none since the last success
  std::atomic<int> last_accept_errno_{0};
  absl::flat_hash_map<uint16_t, DataOpHandler> handlers_;  // fixed once started
  std::string endpoint_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd that wakes the accept loop on Stop()
  std::thread accept_thread_;
  bool started_ = false;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<std::unique_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> per_peer_ ABSL_GUARDED_BY(mu_);  // authenticated
  int authenticated_ ABSL_GUARDED_BY(mu_) = 0;
  std::list<Conn*> pending_ ABSL_GUARDED_BY(mu_);  // oldest first
  absl::flat_hash_map<std::string, int> pending_per_peer_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mc::transfer::tcp
