#include "client/store/gpu_buffer_service.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "client/access/grpc_caller.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "proto/status_convert.h"

namespace mc::client {

namespace {
constexpr size_t kMaxUuidChars = 64;  // "GPU-" + 36, with room for other spellings
}  // namespace

absl::StatusOr<std::string> GpuBufferService::Admit(grpc::ServerContext* context) const {
  if (context == nullptr) return std::string();
  return AdmitCaller(*context, auth_, sessions_);
}

grpc::Status GpuBufferService::RegisterGpuBuffer(
    grpc::ServerContext* context, const mcstore::v1::RegisterGpuBufferRequest* request,
    mcstore::v1::RegisterGpuBufferResponse* response) {
  absl::StatusOr<std::string> owner = Admit(context);
  if (!owner.ok()) return ToGrpcStatus(owner.status());
  if (request->version() != 1) {
    return ToGrpcStatus(McError(Code::kInvalidArgument, "RegisterGpuBuffer: version must be 1"));
  }
  GpuBufferSpec spec;
  spec.device = request->device();
  spec.allocation_offset = request->allocation_offset();
  spec.size = request->size();
  if (!request->device_uuid().empty()) {
    // The caller's ordinal may name another GPU here (other CUDA_VISIBLE_DEVICES): its UUID
    // must be the one of the device the handle would be opened on.
    if (request->device_uuid().size() > kMaxUuidChars) {
      return ToGrpcStatus(
          McError(Code::kInvalidArgument, "RegisterGpuBuffer: device_uuid longer than a GPU UUID"));
    }
    absl::StatusOr<std::string> uuid = api_.DeviceUuid(spec.device);
    if (!uuid.ok()) {
      return ToGrpcStatus(McError(Code::kInvalidArgument,
                                  absl::StrCat("RegisterGpuBuffer: cannot read the UUID of device ",
                                               spec.device, ": ", uuid.status().message())));
    }
    if (!transfer::cuda::SameGpuUuid(request->device_uuid(), *uuid)) {
      return ToGrpcStatus(McError(
          Code::kInvalidArgument,
          absl::StrCat(
              "RegisterGpuBuffer: device ", spec.device, " of this mc-client is ", *uuid, ", not ",
              request->device_uuid(),
              ": send this mc-client's ordinal of that GPU (CUDA_VISIBLE_DEVICES differ?)")));
    }
  }
  int fd = -1;  // a POSIX-fd handle taken from the tickets, closed once imported
  switch (request->kind()) {
    case mcstore::v1::GPU_HANDLE_CUDA_IPC:
      spec.kind = transfer::cuda::GpuHandleKind::kCudaIpc;
      spec.handle = std::span<const uint8_t>(
          reinterpret_cast<const uint8_t*>(request->handle().data()), request->handle().size());
      break;
    case mcstore::v1::GPU_HANDLE_POSIX_FD: {
      if (tickets_ == nullptr) {
        return ToGrpcStatus(McError(Code::kUnavailable,
                                    "RegisterGpuBuffer: POSIX-fd handles come over the fd socket, "
                                    "which this mc-client does not serve (--unix_socket)"));
      }
      absl::StatusOr<int> taken = tickets_->Take(request->fd_ticket(), *owner);
      if (!taken.ok()) return ToGrpcStatus(taken.status());
      fd = *taken;
      spec.kind = transfer::cuda::GpuHandleKind::kPosixFd;
      spec.fd = fd;
      break;
    }
    default:
      return ToGrpcStatus(McError(Code::kInvalidArgument, "RegisterGpuBuffer: unknown kind"));
  }
  absl::StatusOr<uint64_t> id = registry_.Register(spec, *owner);
  if (fd >= 0) close(fd);  // the import holds the memory; the registry borrowed the fd
  if (!id.ok()) return ToGrpcStatus(id.status());
  response->set_buffer_id(*id);
  if (absl::StatusOr<std::string> name = api_.DeviceName(spec.device); name.ok()) {
    response->set_device_name(*name);
  }
  return grpc::Status::OK;
}

grpc::Status GpuBufferService::UnregisterGpuBuffer(
    grpc::ServerContext* context, const mcstore::v1::UnregisterGpuBufferRequest* request,
    mcstore::v1::UnregisterGpuBufferResponse* /*response*/) {
  absl::StatusOr<std::string> owner = Admit(context);
  if (!owner.ok()) return ToGrpcStatus(owner.status());
  return ToGrpcStatus(registry_.Unregister(request->buffer_id(), *owner));
}

}  // namespace mc::client
