// Chooses the transport of each request. The only place that knows which transports exist:
// `local` for our own endpoint; for other endpoints `rdma` (built with MC_WITH_RDMA, a device
// opened, transport "auto" or "rdma") when the peer answered our rdma connection setup and the
// request's local buffers are registered memory, `tcp` otherwise and always for SSD records
// (two-sided, served by the peer's SSD tier over tcp). Before all of these, `cuda` takes every
// request with a local buffer in GPU memory (when a cuda.device was asked for and opened).
// Thread-safe: the transport list is immutable after construction; transports are thread-safe.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "transfer/peer_exchange.h"
#include "transfer/transfer_engine.h"
#include "transfer/transport.h"

namespace mc::transfer {
namespace cuda {
class CudaTransport;
}  // namespace cuda
namespace rdma {
class RdmaConnector;
class RdmaTransport;
}  // namespace rdma

class TransportRegistry {
 public:
  TransportRegistry(const TransferEngineOptions& options, SegmentTable& local_segments);
  ~TransportRegistry();

  // Index (into transports()) of the transport that serves `request`.
  size_t Choose(const TransferRequest& request) const;
  const std::vector<std::unique_ptr<Transport>>& transports() const { return transports_; }
  // The GPU transport's capability, or null.
  GpuTransfers* gpu() const;
  // The data-plane ops any transport this registry may build serves (rdma: kRdmaConnect).
  static std::span<const DataOp> DataOps();
  absl::Status status() const { return status_; }

 private:
  void AddCuda(const TransferEngineOptions& options, SegmentTable& local_segments);

  const std::string local_endpoint_;
  const bool force_rdma_;
  // The rdma setup's way to peers (tcp's data plane) and its connector, unless a test's; declared
  // before the transports that use them.
  std::unique_ptr<PeerExchange> own_exchange_;
  std::unique_ptr<rdma::RdmaConnector> own_connector_;
  std::vector<std::unique_ptr<Transport>> transports_;
  size_t local_index_ = 0;
  size_t tcp_index_ = 0;
  size_t rdma_index_ = 0;
  rdma::RdmaTransport* rdma_ = nullptr;  // one of transports_, or null
  size_t cuda_index_ = 0;
  cuda::CudaTransport* cuda_ = nullptr;  // one of transports_, or null
  absl::Status status_;
};

}  // namespace mc::transfer
