#include "transfer/transport_registry.h"

#include "common/logging.h"
#include "common/status.h"
#include "transfer/cuda/cuda_transport.h"
#include "transfer/local/local_transport.h"
#include "transfer/rdma/handshake.h"
#include "transfer/rdma/rdma_transport.h"
#include "transfer/tcp/peer_exchange.h"
#include "transfer/tcp/tcp_transport.h"

namespace mc::transfer {

TransportRegistry::TransportRegistry(const TransferEngineOptions& options,
                                     SegmentTable& local_segments)
    : local_endpoint_(options.local_endpoint), force_rdma_(options.transport == "rdma") {
  local_index_ = transports_.size();
  transports_.push_back(std::make_unique<LocalTransport>(options.local, local_segments));
  tcp_index_ = transports_.size();
  transports_.push_back(std::make_unique<TcpTransport>(options.tcp));

  if (options.transport != "tcp") {
    absl::StatusOr<std::unique_ptr<rdma::VerbsDevice>> device =
        McError(Code::kUnavailable, "rdma: built without libibverbs");
    if (options.rdma.device_factory) {
      std::unique_ptr<rdma::VerbsDevice> d = options.rdma.device_factory();
      if (d != nullptr) device = std::move(d);
    } else {
#if MC_WITH_RDMA
      device =
          rdma::OpenVerbsDevice(options.rdma.device, options.rdma.port, options.rdma.gid_index);
#endif
    }
    if (device.ok()) {
      rdma::RdmaConnector* connector = options.rdma.connector;
      if (connector == nullptr) {
        // The setup rides the tcp data plane, authenticated as tcp's connections are.
        own_exchange_ = std::make_unique<tcp::TcpPeerExchange>(5000, options.tcp.cluster_keys);
        own_connector_ = std::make_unique<rdma::DataPlaneRdmaConnector>(*own_exchange_);
        connector = own_connector_.get();
      }
      rdma::RdmaTransportOptions r;
      r.qps_per_peer = options.rdma.qps_per_peer;
      Logger("transfer")
          .info("rdma transport on device {} (max_sge {}, mtu {})", (*device)->attributes().name,
                (*device)->attributes().max_sge, (*device)->attributes().active_mtu);
      auto transport = std::make_unique<rdma::RdmaTransport>(r, *std::move(device), *connector);
      transport->ServeSegments(&local_segments);
      rdma_ = transport.get();
      rdma_index_ = transports_.size();
      transports_.push_back(std::move(transport));
    } else if (force_rdma_) {
      status_ = device.status();
      Logger("transfer")
          .error("transport rdma asked for but unavailable: {}", device.status().ToString());
    } else {
      Logger("transfer").info("no rdma ({}); remote transfers use tcp", device.status().ToString());
    }
  }
  if (options.cuda.device >= 0) AddCuda(options, local_segments);
}

void TransportRegistry::AddCuda(const TransferEngineOptions& options,
                                SegmentTable& local_segments) {
  absl::StatusOr<std::unique_ptr<cuda::CudaApi>> api =
      McError(Code::kUnavailable, "cuda: built without the CUDA toolkit");
  if (options.cuda.api_factory) {
    api = options.cuda.api_factory();
  } else {
#if MC_WITH_CUDA
    api = cuda::OpenCudaApi();
#endif
  }
  absl::StatusOr<std::unique_ptr<cuda::CudaTransport>> transport =
      McError(Code::kUnavailable, "cuda: no device");
  if (!api.ok()) {
    transport = api.status();
  } else {
    cuda::CudaTransportOptions c;
    c.local_endpoint = local_endpoint_;
    c.mover.device = options.cuda.device;
    c.mover.streams = options.cuda.streams;
    c.mover.streams_per_move = options.cuda.streams;
    c.metrics = options.metrics;
    absl::StatusOr<GpuDirectRdma> direct = ParseGpuDirectRdma(options.cuda.gpu_direct_rdma);
    if (!direct.ok()) {
      status_ = direct.status();
      Logger("transfer").error("{}", direct.status().ToString());
      return;
    }
    c.gpu_direct_rdma = *direct;
    if (c.gpu_direct_rdma == GpuDirectRdma::kOn && rdma_ == nullptr) {
      status_ = McError(Code::kUnavailable,
                        "GPUDirect RDMA required (gpu_direct_rdma on) but there is no rdma "
                        "transport (transport tcp, no verbs device, or built without verbs)");
      Logger("transfer").error("{}", status_.ToString());
      return;
    }
    transport = cuda::CudaTransport::Create(c, *std::move(api), local_segments);
  }
  if (!transport.ok()) {
    Logger("transfer")
        .warn("no cuda transport ({}); GPU buffers unavailable", transport.status().ToString());
    return;
  }
  cuda_ = transport->get();
  cuda_->SetRemoteDma(rdma_);  // GPUDirect RDMA, when there is rdma
  cuda_index_ = transports_.size();
  transports_.push_back(*std::move(transport));
  Logger("transfer").info("cuda transport on device {}", options.cuda.device);
}

TransportRegistry::~TransportRegistry() = default;

GpuTransfers* TransportRegistry::gpu() const { return cuda_; }

std::span<const DataOp> TransportRegistry::DataOps() {
  static constexpr DataOp kOps[] = {DataOp::kRdmaConnect};
  return kOps;
}

size_t TransportRegistry::Choose(const TransferRequest& request) const {
  if (cuda_ != nullptr && cuda_->HandlesRequest(request)) return cuda_index_;
  if (!local_endpoint_.empty() && request.endpoint == local_endpoint_) return local_index_;
  // SSD records and index notices are two-sided: tcp (transfer/data_server.h says why).
  if (rdma_ == nullptr || AsSegmentRange(request) == nullptr) return tcp_index_;
  // Local memory the device does not know (inline payloads, application buffers past the
  // daemon's rdma budget) cannot be an RDMA source or sink, even when rdma is forced.
  if (!rdma_->LocalBuffersRegistered(request)) return tcp_index_;
  if (force_rdma_) return rdma_index_;
  return rdma_->PeerReachable(request.endpoint) ? rdma_index_ : tcp_index_;
}

}  // namespace mc::transfer
