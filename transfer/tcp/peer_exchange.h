// The tcp PeerExchange (transfer/peer_exchange.h): a fresh data-plane connection per exchange,
// the AUTH handshake when cluster keys are given (so only a cluster member gets, e.g., rkeys),
// one request frame (no capability block) and its response frame, each step bounded by
// `timeout_ms`. With keys and `encrypt`, the connection is encrypted as the tcp transport's
// (sealed_records.h). Thread-safe: it shares nothing between exchanges.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/auth.h"
#include "transfer/peer_exchange.h"

namespace mc::transfer::tcp {

class TcpPeerExchange final : public PeerExchange {
 public:
  explicit TcpPeerExchange(int64_t timeout_ms = 5000, auth::ClusterKeysPtr keys = nullptr,
                           bool encrypt = false)
      : timeout_ms_(timeout_ms), keys_(std::move(keys)), encrypt_(encrypt) {}
  absl::StatusOr<std::string> Exchange(const std::string& endpoint, DataOp op,
                                       std::string_view payload,
                                       uint64_t max_response_bytes) override;

 private:
  const int64_t timeout_ms_;
  const auth::ClusterKeysPtr keys_;  // null: no handshake
  const bool encrypt_;
};

}  // namespace mc::transfer::tcp
