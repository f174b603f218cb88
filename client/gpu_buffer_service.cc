#include "client/gpu_buffer_service.h"

#include "common/status.h"
#include "proto/status_convert.h"

namespace mc::client {

grpc::Status GpuBufferService::RegisterGpuBuffer(
    grpc::ServerContext* /*context*/, const mcstore::v1::RegisterGpuBufferRequest* request,
    mcstore::v1::RegisterGpuBufferResponse* response) {
  if (request->version() != 1) {
    return ToGrpcStatus(McError(Code::kInvalidArgument, "RegisterGpuBuffer: version must be 1"));
  }
  GpuBufferSpec spec;
  spec.device = request->device();
  spec.allocation_offset = request->allocation_offset();
  spec.size = request->size();
  switch (request->kind()) {
    case mcstore::v1::GPU_HANDLE_CUDA_IPC:
      spec.kind = transfer::cuda::GpuHandleKind::kCudaIpc;
      spec.handle = std::span<const uint8_t>(
          reinterpret_cast<const uint8_t*>(request->handle().data()), request->handle().size());
      break;
    case mcstore::v1::GPU_HANDLE_POSIX_FD:
      // TODO(issue 18): take the fd named by fd_ticket from the fd-passing channel of the
      // fd-based RegisterBuffer (SCM_RIGHTS with peer credentials) once that lands.
      return ToGrpcStatus(
          McError(Code::kUnavailable, "RegisterGpuBuffer: POSIX fd handles need the fd channel"));
    default:
      return ToGrpcStatus(McError(Code::kInvalidArgument, "RegisterGpuBuffer: unknown kind"));
  }
  absl::StatusOr<uint64_t> id = registry_.Register(spec);
  if (!id.ok()) return ToGrpcStatus(id.status());
  response->set_buffer_id(*id);
  if (absl::StatusOr<std::string> name = api_.DeviceName(spec.device); name.ok()) {
    response->set_device_name(*name);
  }
  return grpc::Status::OK;
}

grpc::Status GpuBufferService::UnregisterGpuBuffer(
    grpc::ServerContext* /*context*/, const mcstore::v1::UnregisterGpuBufferRequest* request,
    mcstore::v1::UnregisterGpuBufferResponse* /*response*/) {
  return ToGrpcStatus(registry_.Unregister(request->buffer_id()));
}

}  // namespace mc::client
