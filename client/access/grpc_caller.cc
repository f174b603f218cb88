#include "client/access/grpc_caller.h"

#include "common/status_macros.h"

namespace mc::client {

std::string_view MetadataValue(const grpc::ServerContext& context, std::string_view name) {
  const auto& md = context.client_metadata();
  auto it = md.find(grpc::string_ref(name.data(), name.size()));
  if (it == md.end()) return {};
  return std::string_view(it->second.data(), it->second.size());
}

absl::StatusOr<std::string> AdmitCaller(grpc::ServerContext& context, const StoreAuth* auth,
                                        const CallerSessions* sessions) {
  const std::string peer = context.peer();
  if (auth != nullptr) {
    MC_RETURN_IF_ERROR(auth->Check(peer, MetadataValue(context, "authorization"),
                                   MetadataValue(context, "x-mc-store-token")));
  }
  absl::StatusOr<std::string> owner =
      StoreAuth::OwnerOf(peer, MetadataValue(context, "x-mc-owner"), sessions);
  if (!owner.ok()) context.AddTrailingMetadata(kErrorHeader, kSessionLostValue);
  return owner;
}

}  // namespace mc::client
