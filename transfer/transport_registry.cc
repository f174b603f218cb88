#include "transfer/transport_registry.h"

#include <cstdint>

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
                                     SegmentTable& local_segments) {
  // Built in dependency order (cuda needs rdma), routed in Choose's order.
  const size_t local =
      Add(std::make_unique<LocalTransport>(options.local, local_segments, options.local_endpoint));
  const size_t tcp = Add(std::make_unique<TcpTransport>(options.tcp));
  std::unique_ptr<rdma::RdmaTransport> rdma_transport;
  if (options.transport != "tcp") rdma_transport = MakeRdma(options, local_segments);
  rdma::RdmaTransport* rdma = rdma_transport.get();
  const size_t rdma_index = rdma != nullptr ? Add(std::move(rdma_transport)) : SIZE_MAX;
  std::unique_ptr<cuda::CudaTransport> cuda;
  if (options.cuda.device >= 0) cuda = MakeCuda(options, local_segments, rdma != nullptr);
  if (cuda != nullptr) cuda->SetRemoteDma(rdma);  // GPUDirect RDMA, when there is rdma
  cuda_ = cuda.get();
  const size_t cuda_index = cuda != nullptr ? Add(std::move(cuda)) : SIZE_MAX;
  const TransportContext context{options.local_endpoint, local_segments, options.metrics};
  for (const TransportFactory& make : options.extra_transports) {
    std::unique_ptr<Transport> added = make(context);
    if (added == nullptr) continue;
    Logger("transfer").info("transport {} added", added->name());
    routing_.push_back(Add(std::move(added)));
  }
  for (size_t i : {cuda_index, local, rdma_index, tcp}) {
    if (i != SIZE_MAX) routing_.push_back(i);
  }
}

size_t TransportRegistry::Add(std::unique_ptr<Transport> transport) {
  transports_.push_back(std::move(transport));
  return transports_.size() - 1;
}

std::unique_ptr<rdma::RdmaTransport> TransportRegistry::MakeRdma(
    const TransferEngineOptions& options, SegmentTable& local_segments) {
  const bool forced = options.transport == "rdma";
  absl::StatusOr<std::unique_ptr<rdma::VerbsDevice>> device =
      McError(Code::kUnavailable, "rdma: built without libibverbs");
  if (options.rdma.device_factory) {
    std::unique_ptr<rdma::VerbsDevice> d = options.rdma.device_factory();
    if (d != nullptr) device = std::move(d);
  } else {
#if MC_WITH_RDMA
    device = rdma::OpenVerbsDevice(options.rdma.device, options.rdma.port, options.rdma.gid_index);
#endif
  }
  if (!device.ok()) {
    if (forced) {
      status_ = device.status();
      Logger("transfer")
          .error("transport rdma asked for but unavailable: {}", device.status().ToString());
    } else {
      Logger("transfer").info("no rdma ({}); remote transfers use tcp", device.status().ToString());
    }
    return nullptr;
  }
  rdma::RdmaConnector* connector = options.rdma.connector;
  if (connector == nullptr) {
    // The setup rides the tcp data plane, authenticated as tcp's connections are.
    own_exchange_ = std::make_unique<tcp::TcpPeerExchange>(5000, options.tcp.cluster_keys,
                                                           options.tcp.encryption);
    own_connector_ = std::make_unique<rdma::DataPlaneRdmaConnector>(*own_exchange_);
    connector = own_connector_.get();
  }
  rdma::RdmaTransportOptions r;
  r.qps_per_peer = options.rdma.qps_per_peer;
  r.no_fallback = forced;
  Logger("transfer")
      .info("rdma transport on device {} (max_sge {}, mtu {})", (*device)->attributes().name,
            (*device)->attributes().max_sge, (*device)->attributes().active_mtu);
  auto transport = std::make_unique<rdma::RdmaTransport>(r, *std::move(device), *connector);
  transport->ServeSegments(&local_segments);
  return transport;
}

std::unique_ptr<cuda::CudaTransport> TransportRegistry::MakeCuda(
    const TransferEngineOptions& options, SegmentTable& local_segments, bool have_rdma) {
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
    c.local_endpoint = options.local_endpoint;
    c.mover.device = options.cuda.device;
    c.mover.streams = options.cuda.streams;
    c.mover.streams_per_move = options.cuda.streams;
    c.metrics = options.metrics;
    absl::StatusOr<GpuDirectRdma> direct = ParseGpuDirectRdma(options.cuda.gpu_direct_rdma);
    if (!direct.ok()) {
      status_ = direct.status();
      Logger("transfer").error("{}", direct.status().ToString());
      return nullptr;
    }
    c.gpu_direct_rdma = *direct;
    if (c.gpu_direct_rdma == GpuDirectRdma::kOn && !have_rdma) {
      status_ = McError(Code::kUnavailable,
                        "GPUDirect RDMA required (gpu_direct_rdma on) but there is no rdma "
                        "transport (transport tcp, no verbs device, or built without verbs)");
      Logger("transfer").error("{}", status_.ToString());
      return nullptr;
    }
    transport = cuda::CudaTransport::Create(c, *std::move(api), local_segments);
  }
  if (!transport.ok()) {
    Logger("transfer")
        .warn("no cuda transport ({}); GPU buffers unavailable", transport.status().ToString());
    return nullptr;
  }
  Logger("transfer").info("cuda transport on device {}", options.cuda.device);
  return *std::move(transport);
}

TransportRegistry::~TransportRegistry() = default;

GpuTransfers* TransportRegistry::gpu() const { return cuda_; }

std::span<const DataOp> TransportRegistry::DataOps() {
  static constexpr DataOp kOps[] = {DataOp::kRdmaConnect};
  return kOps;
}

size_t TransportRegistry::Choose(const TransferRequest& request) const {
  for (size_t i : routing_) {
    if (transports_[i]->Claims(request)) return i;
  }
  return routing_.back();  // tcp, which claims every request
}

}  // namespace mc::transfer
