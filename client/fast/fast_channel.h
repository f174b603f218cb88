// FastChannelServer: Store calls over a Unix SOCK_SEQPACKET socket (default path
// <unix_socket>.fast, same mode and group as the Unix socket), without gRPC: one datagram each
// way carrying the Store service's own protobuf messages (fast_protocol.h has the format,
// fast_dispatch.h the rules). gRPC stays the control path and the fallback; a call here is
// admitted and served exactly as the same gRPC call over the Unix socket would be
// (FastStoreCalls, implemented by StoreGrpcService).
//
// One thread per connection (blocking poll -> recv -> handle -> send, one call at a time, its
// receive buffer, reply buffer and arena reused); a client wanting concurrency opens more.
// Bounds: max_connections in all and max_connections_per_uid per peer uid (more are answered
// RESOURCE_EXHAUSTED and closed); the first datagram within first_message_timeout_ms; every
// datagram and reply at most max_message_bytes (the effective figure: the kernel may cap the
// send buffer lower, see Start). A reply the peer does not take at once (its socket's send
// buffer full) ends the connection. Stop wakes and joins every connection thread. Thread-safe.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "client/access/store_auth.h"
#include "client/fast/fast_dispatch.h"
#include "client/fast/fast_store_calls.h"
#include "common/metrics.h"

namespace mc::client {

struct FastChannelOptions {
  std::string path;                     // the socket; required
  mode_t mode = 0660;                   // --unix_socket_mode
  std::optional<gid_t> group;           // --unix_socket_group
  int max_connections = 128;            // --store_fast_max_connections
  int max_connections_per_uid = 32;     // --store_fast_max_connections_per_uid
  uint32_t max_message_bytes = 262144;  // --store_fast_max_message_bytes (4096..4194304)
  int64_t first_message_timeout_ms = 5000;
};

class FastChannelServer {
 public:
  // `calls`, `sessions` (null: only anonymous callers may attach) and `metrics` are borrowed
  // and must outlive this object.
  FastChannelServer(FastChannelOptions options, FastStoreCalls& calls,
                    const CallerSessions* sessions, MetricsRegistry& metrics);
  ~FastChannelServer();
  FastChannelServer(const FastChannelServer&) = delete;
  FastChannelServer& operator=(const FastChannelServer&) = delete;

  // Checks the options, finds the effective message limit (SO_SNDBUFFORCE, else SO_SNDBUF; a
  // lower kernel cap lowers it, logged once), binds (replacing a stale socket), applies mode and
  // group, listens, starts the accepting thread.
  absl::Status Start();
  // Stops accepting, wakes and joins every connection thread, unlinks the socket.
  void Stop();

  // Open connections (mc_store_fast_connections).
  int Connections() const { return live_.load(); }
  // The largest datagram either way, as announced to ATTACH (valid after Start).
  uint32_t max_message_bytes() const { return max_message_bytes_; }

 private:
  struct Conn {
    int fd = -1;
    uid_t uid = 0;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  void AcceptLoop();
  void Accept();
  // The connection's thread: serves its datagrams until it closes, fails, or Stop.
  void Serve(Conn* conn);
  // Waits for the connection's next datagram; false when it is to be closed. `*hung_up`: the
  // peer closed its end (a read of 0 bytes is then the end, not an empty datagram).
  bool WaitReadable(int fd, int timeout_ms, bool* hung_up);
  // Joins the threads of connections that ended.
  void Reap();
  // Sizes `fd`'s send buffer for a reply of `bytes`; returns the largest datagram it allows.
  static uint32_t SizeSendBuffer(int fd, uint32_t bytes);

  const FastChannelOptions options_;
  FastStoreCalls& calls_;
  const CallerSessions* const sessions_;
  MetricsRegistry& metrics_;
  uint32_t max_message_bytes_ = 0;            // effective; fixed at Start
  std::unique_ptr<FastDispatcher> dispatch_;  // made at Start
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: Stop makes it readable for good, waking every thread
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> live_{0};
  absl::Mutex mu_;
  std::list<std::unique_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mc::client
