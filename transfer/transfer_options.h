// The transfer engine's options: one struct per transport, nested in TransferEngineOptions, plus
// the few that are the engine's own (which transport may carry remote requests, metrics).
// Defaults are mc-client's flag defaults (client/client_main.cc maps each flag to one field
// here). Fields marked "Test seam" replace a device or the network in unit tests and are never
// set in production. Plain data: no behaviour here but ParseGpuDirectRdma and ParseOnOff.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/auth.h"
#include "common/metrics.h"
#include "transfer/tcp/socket_util.h"

namespace mc::transfer {

class Transport;
struct TransportContext;
// Builds a transport for the engine (transfer/transport.h; docs/architecture.md, "Adding a
// transport"). Returns null to add none.
using TransportFactory = std::function<std::unique_ptr<Transport>(const TransportContext&)>;

namespace rdma {
class VerbsDevice;
class RdmaConnector;
}  // namespace rdma
namespace cuda {
class CudaApi;
}  // namespace cuda

// `local` (transfer/local/): requests to this daemon's own segments, by memcpy.
struct LocalTransportOptions {
  uint64_t parallel_copy_threshold = 8 << 20;   // bytes; a lone copy above it is split
  uint64_t parallel_batch_threshold = 1 << 20;  // bytes; a batch above it runs on the helpers
  uint64_t checksum_chunk_bytes = 256 << 10;    // copy+hash granularity of hashed transfers
  int copy_threads = 2;                         // helper threads (0 = caller only)
};

// `tcp` (transfer/tcp/): remote requests over our framed protocol.
struct TcpTransportOptions {
  int connections_per_peer = 4;  // pooled connections per peer (and per batch)
  // Socket buffers of tcp connections, outgoing and served (tcp/socket_util.h): SO_SNDBUF,
  // SO_RCVBUF (0 = kernel autotuning) and, when the receive buffer autotunes, the size it starts
  // from (0 = net.ipv4.tcp_rmem's default).
  tcp::SocketBuffers socket_buffers = tcp::kDataPlaneBuffers;
  uint64_t frame_bytes = 4 << 20;  // a request is cut into frames of at most this many bytes
  int receive_threads = 2;         // helper threads running poll loops (0 = caller only)
  // Cluster keys: connections (and the rdma connection setup, which rides the tcp data plane)
  // run the AUTH handshake; null = none (--auth=false).
  auth::ClusterKeysPtr cluster_keys;
  // With cluster_keys: connections ask for encryption (AES-256-GCM records, transfer/tcp/
  // sealed_records.h), and this daemon's data-plane server requires it (--data_encryption).
  bool encryption = false;
};

// `rdma` (transfer/rdma/): one-sided READ/WRITE over ibverbs RC queue pairs.
struct RdmaOptions {
  std::string device;  // verbs device name ("" = the first with an active port)
  int port = 1;
  int gid_index = 1;  // RoCEv2 IPv4-mapped GID on rxe/mlx5 defaults; 0 on InfiniBand
  int qps_per_peer = 2;
  // Test seam: opens this verbs device instead of libibverbs (e.g. tests/fakes/fake_verbs.h).
  std::function<std::unique_ptr<rdma::VerbsDevice>()> device_factory;
  // Test seam: carries the connection setup (default: over the peer's tcp data plane).
  rdma::RdmaConnector* connector = nullptr;
};

// GPUDirect RDMA of registered GPU buffers (mc-client --gpu_direct_rdma).
enum class GpuDirectRdma : uint8_t {
  kOff,   // never: remote replicas are staged through pinned host memory
  kAuto,  // where the device, driver and NIC allow it; elsewhere staged (logged)
  kOn,    // required: a GPU buffer that cannot be registered with the NIC is refused
};
// "off" | "auto" | "on" (INVALID_ARGUMENT otherwise).
absl::StatusOr<GpuDirectRdma> ParseGpuDirectRdma(std::string_view text);
// "on" -> true, "off" -> false (INVALID_ARGUMENT otherwise), e.g. --data_encryption.
absl::StatusOr<bool> ParseOnOff(std::string_view text);

// `cuda` (transfer/cuda/): requests whose local buffers are GPU memory.
struct CudaOptions {
  int device = -1;  // the CUDA device whose memory local buffers may be; -1 opens none
  int streams = 4;  // streams of the GPU mover
  // GPUDirect RDMA: "auto", "off" or "on" (ParseGpuDirectRdma).
  std::string gpu_direct_rdma = "auto";
  // Test seam: opens this instead of cudart (tests/fakes/fake_cuda.h).
  std::function<std::unique_ptr<cuda::CudaApi>()> api_factory;
};

struct TransferEngineOptions {
  std::string local_endpoint;  // this daemon's data-plane endpoint; requests to it use `local`
  // Remote transport: "auto" (rdma for peers that answered an rdma connection setup, tcp for the
  // others and for SSD records and index notices), "tcp" (never rdma) or "rdma" (rdma for every
  // remote segment READ/WRITE; no fallback, errors surface). See transfer/rdma/rdma_transport.h.
  std::string transport = "auto";
  MetricsRegistry* metrics = nullptr;  // optional: transfer bytes/errors by transport

  LocalTransportOptions local;
  TcpTransportOptions tcp;
  RdmaOptions rdma;
  CudaOptions cuda;
  // Transports added to the built-in ones, asked first (in this order) whether they claim a
  // request (Transport::Claims). mc-client adds none; tests/unit/transfer/test_transport_test.cc
  // adds one.
  std::vector<TransportFactory> extra_transports;
};

}  // namespace mc::transfer
