// The GpuBuffers gRPC service (proto/mcstore/v1/gpu.proto): proto in -> GpuBufferRegistry ->
// proto out. Served by mc-client next to Store when it has a cuda transport (--cuda_device).
//
// Handles: a CUDA IPC handle (64 bytes in the request), or a POSIX-fd handle passed over the fd
// channel first and named by its fd_ticket (client/gpu/gpu_fd_tickets.h; only the session that
// passed it may name it). A CUDA IPC handle is a capability (whoever holds its 64 bytes can open
// the allocation), so every call is admitted exactly as Store's are: the transport check of
// StoreAuth (the token over TCP, the socket's mode and group over the Unix socket), then the
// caller's owner key (StoreAuth::OwnerOf). A buffer belongs to the owner that registered it;
// another owner's id is unknown to Unregister and to the batch paths. A null ServerContext
// (in-process calls, unit tests) is the trusted owner "". Thread-safe (the registry is).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "client/access/store_auth.h"
#include "client/gpu/gpu_buffers.h"
#include "client/gpu/gpu_fd_tickets.h"
#include "mcstore/v1/gpu.grpc.pb.h"

namespace mc::client {

class GpuBufferService final : public mcstore::v1::GpuBuffers::Service {
 public:
  explicit GpuBufferService(GpuBufferRegistry& registry, transfer::cuda::CudaApi& api)
      : registry_(registry), api_(api) {}

  // Access control, as StoreGrpcService::SetAccess: `auth` checks the transport (null: every
  // call passes), `sessions` says which owner tokens are live (null: every caller is
  // anonymous). Borrowed; call before serving.
  void SetAccess(const StoreAuth* auth, const CallerSessions* sessions) {
    auth_ = auth;
    sessions_ = sessions;
  }
  // Where the fd channel parks POSIX-fd handles (borrowed; null: GPU_HANDLE_POSIX_FD is
  // refused). Call before serving.
  void SetFdTickets(GpuFdTickets* tickets) { tickets_ = tickets; }

  grpc::Status RegisterGpuBuffer(grpc::ServerContext* context,
                                 const mcstore::v1::RegisterGpuBufferRequest* request,
                                 mcstore::v1::RegisterGpuBufferResponse* response) override;
  grpc::Status UnregisterGpuBuffer(grpc::ServerContext* context,
                                   const mcstore::v1::UnregisterGpuBufferRequest* request,
                                   mcstore::v1::UnregisterGpuBufferResponse* response) override;

 private:
  // Authenticates the call; its owner key.
  absl::StatusOr<std::string> Admit(grpc::ServerContext* context) const;

  GpuBufferRegistry& registry_;
  transfer::cuda::CudaApi& api_;
  const StoreAuth* auth_ = nullptr;
  const CallerSessions* sessions_ = nullptr;
  GpuFdTickets* tickets_ = nullptr;
};

}  // namespace mc::client
