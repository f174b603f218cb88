// The GpuBuffers gRPC service (proto/mcstore/v1/gpu.proto): proto in -> GpuBufferRegistry ->
// proto out. Served by mc-client next to Store once wired (see docs/gpu.md, "Wiring").
// Thread-safe (the registry is).
#pragma once

#include <string>

#include "client/gpu_buffers.h"
#include "mcstore/v1/gpu.grpc.pb.h"

namespace mc::client {

class GpuBufferService final : public mcstore::v1::GpuBuffers::Service {
 public:
  explicit GpuBufferService(GpuBufferRegistry& registry, transfer::cuda::CudaApi& api)
      : registry_(registry), api_(api) {}

  grpc::Status RegisterGpuBuffer(grpc::ServerContext* context,
                                 const mcstore::v1::RegisterGpuBufferRequest* request,
                                 mcstore::v1::RegisterGpuBufferResponse* response) override;
  grpc::Status UnregisterGpuBuffer(grpc::ServerContext* context,
                                   const mcstore::v1::UnregisterGpuBufferRequest* request,
                                   mcstore::v1::UnregisterGpuBufferResponse* response) override;

 private:
  GpuBufferRegistry& registry_;
  transfer::cuda::CudaApi& api_;
};

}  // namespace mc::client
