// Limits every gRPC listener of the daemons sets before any credential is checked
// (docs/security.md, "Connections before any credential"). Header-only.
#pragma once

#include <grpc/grpc.h>
#include <grpcpp/server_builder.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mc {

inline constexpr int64_t kMinGrpcHandshakeTimeoutMs = 100;
inline constexpr int64_t kMaxGrpcHandshakeTimeoutMs = 120'000;  // gRPC's own default

// A connection that has not completed its HTTP/2 handshake (preface and SETTINGS) within
// `timeout_ms` is closed by gRPC (GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS; without it, 120 s), so
// silent connections cannot hold the daemon's fds. INVALID_ARGUMENT outside
// kMinGrpcHandshakeTimeoutMs..kMaxGrpcHandshakeTimeoutMs.
inline absl::Status SetGrpcHandshakeTimeout(grpc::ServerBuilder& builder, int64_t timeout_ms) {
  if (timeout_ms < kMinGrpcHandshakeTimeoutMs || timeout_ms > kMaxGrpcHandshakeTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat("--grpc_handshake_timeout_ms ", timeout_ms,
                                                   " outside ", kMinGrpcHandshakeTimeoutMs, "..",
                                                   kMaxGrpcHandshakeTimeoutMs));
  }
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, static_cast<int>(timeout_ms));
  return absl::OkStatus();
}

}  // namespace mc
