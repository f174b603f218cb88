#include "transfer/transport_registry.h"

#include "transfer/local/local_transport.h"
#include "transfer/tcp/tcp_transport.h"

namespace mc::transfer {

TransportRegistry::TransportRegistry(const TransferEngineOptions& options,
                                     SegmentTable& local_segments)
    : local_endpoint_(options.local_endpoint) {
  LocalTransportOptions local;
  local.parallel_copy_threshold = options.parallel_copy_threshold;
  local.copy_threads = options.copy_threads;
  local_index_ = transports_.size();
  transports_.push_back(std::make_unique<LocalTransport>(local, local_segments));

  TcpTransportOptions tcp;
  tcp.connections_per_peer = options.connections_per_peer;
  tcp.socket_buffer_bytes = options.socket_buffer_bytes;
  tcp.frame_bytes = options.tcp_frame_bytes;
  tcp.receive_threads = options.tcp_receive_threads;
  tcp_index_ = transports_.size();
  transports_.push_back(std::make_unique<TcpTransport>(tcp));

#if MC_WITH_RDMA
  // Placeholder: the rdma transport registers here and is chosen for peers reachable over verbs.
#endif
#if MC_WITH_CUDA
  // Placeholder: the cuda transport registers here and is chosen for device-memory buffers.
#endif
}

TransportRegistry::~TransportRegistry() = default;

size_t TransportRegistry::Choose(const TransferRequest& request) const {
  if (!local_endpoint_.empty() && request.endpoint == local_endpoint_) return local_index_;
  return tcp_index_;
}

}  // namespace mc::transfer
