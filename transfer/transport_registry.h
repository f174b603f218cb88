// Chooses the transport of each request. The only place that knows which transports exist:
// `local` for our own endpoint, `tcp` otherwise; rdma and cuda arrive here (behind
// MC_WITH_RDMA / MC_WITH_CUDA) without touching the engine or the batch paths.
// Thread-safe: immutable after construction; transports are thread-safe.
#pragma once

#include <memory>
#include <vector>

#include "transfer/transfer_engine.h"
#include "transfer/transport.h"

namespace mc::transfer {

class TransportRegistry {
 public:
  TransportRegistry(const TransferEngineOptions& options, SegmentTable& local_segments);
  ~TransportRegistry();

  // Index (into transports()) of the transport that serves `request`.
  size_t Choose(const TransferRequest& request) const;
  const std::vector<std::unique_ptr<Transport>>& transports() const { return transports_; }

 private:
  const std::string local_endpoint_;
  std::vector<std::unique_ptr<Transport>> transports_;
  size_t local_index_ = 0;
  size_t tcp_index_ = 0;
};

}  // namespace mc::transfer
