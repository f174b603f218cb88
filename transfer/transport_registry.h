// Builds the engine's transports and chooses the transport of each request. The only place that
// knows which transports exist: it builds `local`, `tcp`, `rdma` (built with MC_WITH_RDMA, a
// device opened, transport "auto" or "rdma") and `cuda` (a cuda.device asked for and opened)
// from their nested options, wires what one needs of another through the root interfaces
// (RemoteDma for cuda's GPUDirect RDMA, PeerExchange for rdma's connection setup), and adds the
// transports of TransferEngineOptions::extra_transports.
// Choice: the first transport, in routing order, that Claims() the request: the added ones (in
// their order), then `cuda` (a local buffer in GPU memory), `local` (our own endpoint), `rdma`
// (a segment range whose local buffers are registered memory, to a peer that answered our setup,
// or any peer under transport "rdma"), and `tcp`, which takes every request left (SSD records and
// index notices always end there: two-sided, see transfer/data_server.h).
// Thread-safe: the transport lists are immutable after construction; transports are
// thread-safe.
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

  // Index (into transports()) of the transport that serves `request` (may set up an rdma
  // connection to its peer, see RdmaTransport::PeerReachable).
  size_t Choose(const TransferRequest& request) const;
  // Every transport, in the order they were built (memory registration follows it).
  const std::vector<std::unique_ptr<Transport>>& transports() const { return transports_; }
  // The GPU transport's capability, or null.
  GpuTransfers* gpu() const;
  // The data-plane ops any transport this registry may build serves (rdma: kRdmaConnect).
  static std::span<const DataOp> DataOps();
  absl::Status status() const { return status_; }

 private:
  // Opens the verbs device and builds the rdma transport, or says why not (status_ when
  // transport "rdma" was asked for).
  std::unique_ptr<rdma::RdmaTransport> MakeRdma(const TransferEngineOptions& options,
                                                SegmentTable& local_segments);
  // Opens the CUDA device and builds the cuda transport (after rdma: GPUDirect RDMA uses it).
  std::unique_ptr<cuda::CudaTransport> MakeCuda(const TransferEngineOptions& options,
                                                SegmentTable& local_segments, bool have_rdma);
  size_t Add(std::unique_ptr<Transport> transport);

  // The rdma setup's way to peers (tcp's data plane) and its connector, unless a test's; declared
  // before the transports that use them.
  std::unique_ptr<PeerExchange> own_exchange_;
  std::unique_ptr<rdma::RdmaConnector> own_connector_;
  std::vector<std::unique_ptr<Transport>> transports_;
  std::vector<size_t> routing_;          // indices into transports_, in Choose's order
  cuda::CudaTransport* cuda_ = nullptr;  // one of transports_, or null
  absl::Status status_;
};

}  // namespace mc::transfer
