// PeerExchange: one request and its response with a peer's data server, on a connection of
// their own, outside the transfer path. It is how a transport's setup messages ride the data
// plane (the rdma connection setup, DataOp::kRdmaConnect) without that transport depending on
// how the data plane travels: the tcp implementation (transfer/tcp/peer_exchange.h) connects,
// runs the AUTH handshake with the cluster keys, sends one frame and reads one answer; the
// registry hands it to the transports that need it. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "transfer/data_server.h"

namespace mc::transfer {

class PeerExchange {
 public:
  virtual ~PeerExchange() = default;
  // Sends `payload` as one request of `op` (a setup op: one that carries no capability) to the
  // data server at `endpoint` and returns the response's payload, at most `max_response_bytes`
  // (more fails). A peer that answers with an error code: that code (UNAVAILABLE: it does not
  // serve the op now); no connection, no handshake or a malformed answer: an error.
  virtual absl::StatusOr<std::string> Exchange(const std::string& endpoint, DataOp op,
                                               std::string_view payload,
                                               uint64_t max_response_bytes) = 0;
};

}  // namespace mc::transfer
