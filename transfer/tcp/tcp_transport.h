// The `tcp` transport: requests to other daemons over our framed protocol (frame.h), served by
// their TcpDataServer. Each request is cut into frames of at most `frame_bytes`; the frames to
// one peer are spread over up to `connections_per_peer` pooled connections and pipelined (all
// frames of a request that wants a checksum ride one connection, so its frames are hashed in
// order as each lands). The batch's connections are split into groups, each driven by its own
// poll() loop on the caller or one of `receive_threads` helpers, so receiving (and hashing) runs
// on several cores. A connection that errs or still carries work at the deadline is closed,
// failing what it carried.
// Thread-safe: concurrent Submit() calls take distinct connections from the pool.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string_view>

#include "common/auth.h"
#include "transfer/tcp/connection_pool.h"
#include "transfer/tcp/frame.h"
#include "transfer/transfer_options.h"
#include "transfer/transport.h"
#include "transfer/worker_pool.h"

namespace mc::transfer {

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(TcpTransportOptions options);

  std::string_view name() const override { return "tcp"; }
  // Every request: tcp is the registry's fallback, last in its order.
  bool Claims(const TransferRequest& /*request*/) override { return true; }
  void Submit(std::span<const TransferRequest* const> requests,
              std::span<TransferResult> results, int64_t deadline_ms) override;

  tcp::ConnectionPool& pool_for_test() { return pool_; }

 private:
  const TcpTransportOptions options_;
  tcp::ConnectionPool pool_;
  WorkerPool workers_;
  std::atomic<uint64_t> next_request_id_{1};
};

}  // namespace mc::transfer
