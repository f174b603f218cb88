// The TLS flags mc-admin and mc-bench share, defined once (store_channel_flags.cc) for both:
// --tls_ca_file, --tls_cert_file, --tls_key_file, --tls_server_name. They apply to every TCP
// target of the tool (master and Store alike); unix: targets stay plaintext. See
// docs/security.md.
//
// Call after absl::ParseCommandLine, from the main thread.
#pragma once

#include "absl/status/statusor.h"
#include "proto/grpc_tls.h"

namespace mc::tools {

// The --tls_* flags checked (every problem at once, joined) and turned into the security of the
// tool's channels (ToolChannelSecurity, tools/store_channel.h).
absl::StatusOr<ChannelSecurity> ChannelSecurityFromFlags();

}  // namespace mc::tools
