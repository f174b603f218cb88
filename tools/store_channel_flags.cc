#include "tools/store_channel_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "tools/store_channel.h"

ABSL_FLAG(std::string, tls_ca_file, "",
          "dial TCP targets over TLS: their certificates must chain to this CA bundle (PEM) and "
          "name the host dialled (or --tls_server_name) in their subjectAltName");
ABSL_FLAG(std::string, tls_cert_file, "",
          "with --tls_ca_file: client certificate (PEM) for servers that require one");
ABSL_FLAG(std::string, tls_key_file, "", "private key (PEM, mode 0600) of --tls_cert_file");
ABSL_FLAG(std::string, tls_server_name, "",
          "with --tls_ca_file: check server certificates against this name instead of the host");

namespace mc::tools {

absl::StatusOr<ChannelSecurity> ChannelSecurityFromFlags() {
  return ToolChannelSecurity({.ca_file = absl::GetFlag(FLAGS_tls_ca_file),
                              .cert_file = absl::GetFlag(FLAGS_tls_cert_file),
                              .key_file = absl::GetFlag(FLAGS_tls_key_file),
                              .server_name = absl::GetFlag(FLAGS_tls_server_name)});
}

}  // namespace mc::tools
