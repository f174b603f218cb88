// The caller of a local gRPC service of mc-client (Store, GpuBuffers): its token checked and its
// owner key derived the same way for every service, so a buffer registered through one is the
// same caller's in the other.
#pragma once

#include <grpcpp/server_context.h>

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "client/access/store_auth.h"

namespace mc::client {

// The value of request metadata `name` (empty when absent).
std::string_view MetadataValue(const grpc::ServerContext& context, std::string_view name);

// UNAUTHENTICATED when `auth` (null = none required) refuses the caller's token; else its owner
// key (StoreAuth::OwnerOf over `sessions`, borrowed, may be null). A lost session is answered
// FAILED_PRECONDITION with the trailing metadata `x-mc-error: session-lost`, so that clients
// tell it apart from other errors without parsing the message.
inline constexpr char kErrorHeader[] = "x-mc-error";
inline constexpr char kSessionLostValue[] = "session-lost";
absl::StatusOr<std::string> AdmitCaller(grpc::ServerContext& context, const StoreAuth* auth,
                                        const CallerSessions* sessions);

}  // namespace mc::client
