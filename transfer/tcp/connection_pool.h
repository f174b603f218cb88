// Persistent client connections to data-plane peers: a small pool of idle, healthy connections
// per peer endpoint. Acquire() hands out idle ones first and opens new ones lazily; only a
// connection whose every request was answered may be Release()d back. A connection in any other
// state is simply destroyed (closed), never reused. Idle connections that the peer closed
// meanwhile are noticed (poll) and dropped on Acquire. With cluster keys, a new connection runs
// the AUTH handshake (handshake.h) before it is handed out; one that fails it is closed.
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "transfer/tcp/sealed_records.h"
#include "transfer/tcp/socket_util.h"

namespace mc::transfer::tcp {

struct ConnectionPoolOptions {
  int connections_per_peer = 4;  // idle connections kept per peer
  // The data plane's default socket buffers (socket_util.h).
  SocketBuffers socket_buffers = kDataPlaneBuffers;
  auth::ClusterKeysPtr cluster_keys;    // null: no handshake (--auth=false)
  int64_t handshake_timeout_ms = 5000;  // bounds a new connection's handshake (and the deadline)
  // With keys: ask for encrypted connections (sealed_records.h; --data_encryption=on).
  bool encrypt = false;
};

// A non-blocking connected socket to one peer, with its record ciphers when encrypted (their
// counters live as long as the connection: it is pooled with them).
struct PeerConnection {
  std::string endpoint;
  UniqueFd fd;
  std::unique_ptr<RecordSealer> sealer;  // null: plaintext
  std::unique_ptr<RecordOpener> opener;
  // Sealed records waiting for the socket (allocated on first use, kept with the connection so
  // a batch does not allocate it again).
  std::unique_ptr<uint8_t[]> send_buffer;
};

class ConnectionPool {
 public:
  explicit ConnectionPool(ConnectionPoolOptions options) : options_(std::move(options)) {}

  // Up to `count` connections to `endpoint` (at least one, or an error when none can be had).
  absl::StatusOr<std::vector<PeerConnection>> Acquire(const std::string& endpoint, int count,
                                                      int64_t deadline_ms);
  // Returns a healthy connection (no request in flight, no unread byte).
  void Release(PeerConnection conn);

  size_t IdleCountForTest(const std::string& endpoint) const;

 private:
  const ConnectionPoolOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::vector<PeerConnection>> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mc::transfer::tcp
