// MasterLane: the master's end of the master lane (docs/architecture.md, "The master lane"):
// the mc-client daemons' hot calls (GetReplicas, ReleaseLeases, PutStart, PutEnd, PutRevoke,
// Exist, Remove) over plain TCP, one request frame and one reply frame each
// (proto/master_lane_frame.h).
// gRPC's callback server hands every call between several threads (~5 sleeps and wake-ups per
// call, most of a small call's cost); here one thread per connection blocks in recv, answers
// inline and sends: 2 wake-ups per call. Each frame goes through MasterGrpcService's front door
// (leader gate, session authentication, batch limit, per-RPC metrics, the same handlers): the
// lane is no second, weaker way in. It serves session-authenticated calls only; RegisterClient,
// Heartbeat, GetStatus and the rest answer UNIMPLEMENTED (they stay on gRPC).
// Every accepted connection is first greeted (proto/master_lane_frame.h): "ready" with the idle
// timeout, or, over the bound, "full" and closed, so a daemon never sends a request the lane
// will not read. Bounds (docs/security.md): at most max_connections connections (more are
// accepted, greeted "full" and closed at once, counted), and at most max_connections_per_address
// from one IP address (likewise, counted apart), so that one host cannot take the whole bound
// from the others; a connection silent for idle_timeout_ms, or a frame that stops half-way that
// long, is closed; bodies up to max_body_bytes; malformed frames are answered or closed. Metrics:
// mc_master_lane_connections, mc_master_lane_refused_total{reason}. With TLS (options.tls: the gRPC
// listener's files and rules), a TLS handshake bounded by handshake_timeout_ms comes first
// (proto/lane_tls.h); a connection over the bound is then closed without a greeting (the daemon's
// handshake fails). Thread-safe; Stop() joins every thread it started.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "master/grpc_service.h"
#include "proto/grpc_tls.h"
#include "proto/lane_tls.h"
#include "proto/master_lane_frame.h"

namespace google::protobuf {
class Arena;
}

namespace mc::master {

struct MasterLaneOptions {
  std::string listen;                       // HOST:PORT; port 0 = any free port
  size_t max_connections = 4096;            // a thread each (docs/operations.md)
  size_t max_connections_per_address = 64;  // from one IP address: 16 daemons x 4
  int64_t idle_timeout_ms = 60'000;         // also bounds a frame that stops half-way
  size_t max_body_bytes = 256 << 20;
  TlsServerFiles tls{};  // TLS when tls.enabled(): the gRPC listener's files and rules
  int64_t handshake_timeout_ms = 5'000;  // a TLS handshake not done by then is closed
};

class MasterLane {
 public:
  // `service` and `metrics` are borrowed and must outlive the lane.
  MasterLane(MasterLaneOptions options, MasterGrpcService& service, MetricsRegistry& metrics);
  ~MasterLane();
  MasterLane(const MasterLane&) = delete;
  MasterLane& operator=(const MasterLane&) = delete;

  // Listens and starts accepting; returns the bound port.
  absl::StatusOr<int> Start();
  // Closes the listener and every connection, joins their threads. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  size_t ConnectionsForTest() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void AcceptLoop();
  void Serve(uint64_t id, int fd);
  void ServeStream(lane::Stream& stream);
  // Greets `fd` "full" (plaintext) and closes it, counted in `reason`.
  void Refuse(int fd, Counter& reason);
  // One frame's answer, appended to `out`; its messages live on `arena`.
  void Dispatch(const lane::Request& request, google::protobuf::Arena& arena, std::string* out);
  // Joins the threads of connections that ended.
  void ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t IdleTimeoutMs() const {
    return static_cast<uint32_t>(std::min<int64_t>(options_.idle_timeout_ms, UINT32_MAX));
  }

  const MasterLaneOptions options_;
  MasterGrpcService& service_;
  Gauge& connections_gauge_;
  Counter& refused_full_;
  Counter& refused_per_address_;
  Counter& refused_malformed_;
  Counter& closed_idle_;
  Counter& refused_handshake_;
  std::shared_ptr<const lane::TlsContext> tls_;  // null: plaintext
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: wakes the accept loop to stop
  std::thread acceptor_;
  absl::Mutex mu_;
  struct Connection {
    int fd = -1;  // -1 once its thread closed it
    std::thread thread;
    std::string address;  // the peer's IP address (its bytes)
  };
  std::map<uint64_t, Connection> connections_ ABSL_GUARDED_BY(mu_);
  // Connections open (not ended) per peer IP address; an address with none has no entry.
  std::map<std::string, size_t> per_address_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> ended_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace mc::master
