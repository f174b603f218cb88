// TLS for the daemons' gRPC listeners and the channels that call them (docs/security.md, "TLS
// on the gRPC listeners"): certificate files as flags name them, the checks a daemon runs on them
// at start (every problem named with its flag), and the gRPC credentials built from them.
//
// Flags take files only (PEM), never inline PEM. A private key must be a file that group and
// others can neither read nor write (auth::ReadPrivateFile's rule, as for the cluster secret). A
// certificate must parse, not be expired, and match its key. Unix-socket targets ("unix:PATH")
// always stay plaintext: the socket's mode and peer credentials authenticate local callers.
//
// Thread-safe: the functions are pure apart from reading the files; ChannelSecurity is immutable
// once made.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace grpc {
class ChannelArguments;
class ChannelCredentials;
class Channel;
class ServerCredentials;
}  // namespace grpc

namespace mc {

// The names of the flags a component's files come from, for its messages.
struct TlsFlagNames {
  std::string cert = "--tls_cert_file";
  std::string key = "--tls_key_file";
  std::string ca = "--tls_client_ca_file";  // server: clients' CA; channel: the servers' CA
  std::string server_name = "--tls_server_name";
};

// A listener's files. TLS is on when cert_file is set; with client_ca_file every client must
// present a certificate that chains to it (verified), else the handshake fails.
struct TlsServerFiles {
  std::string cert_file{};       // PEM certificate chain (leaf first)
  std::string key_file{};        // PEM private key of the leaf; mode 0600 or stricter
  std::string client_ca_file{};  // PEM CA bundle; "" = no client certificates asked
  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

// A caller's files. TLS is on when ca_file is set: the server's certificate must chain to it and
// name the dialled host (or server_name) in its subjectAltName. cert_file/key_file (both or
// neither) are presented to a server that asks for a client certificate.
struct TlsChannelFiles {
  std::string ca_file{};      // PEM CA bundle the server must chain to; "" = plaintext
  std::string cert_file{};    // optional client certificate chain
  std::string key_file{};     // its key; mode 0600 or stricter
  std::string server_name{};  // "" = the host of each dialled address; else checked against SANs
  bool enabled() const { return !ca_file.empty(); }
};

// Every problem of `files`, each naming its flag (files missing, unreadable, not PEM, a key
// readable by others, a certificate expired or not matching its key, a half-given pair). Reads
// the files. Empty when TLS is off and no file is named.
std::vector<std::string> TlsServerProblems(const TlsServerFiles& files,
                                           const TlsFlagNames& names = {});
std::vector<std::string> TlsChannelProblems(const TlsChannelFiles& files,
                                            const TlsFlagNames& names);

// Server credentials for `files` (insecure when TLS is off). INVALID_ARGUMENT naming the file
// when one cannot be read; run TlsServerProblems first for the full check.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsServerFiles& files, const TlsFlagNames& names = {});

// What a caller needs to open its channels: the credentials and the server-name override.
// Default-constructed: plaintext.
class ChannelSecurity {
 public:
  ChannelSecurity();
  static absl::StatusOr<ChannelSecurity> Make(const TlsChannelFiles& files,
                                              const TlsFlagNames& names);

  bool tls() const { return tls_; }
  // The files it was made from (the master lane's TLS uses the same, proto/lane_tls.h).
  const TlsChannelFiles& files() const { return files_; }
  // Plaintext for "unix:" targets, the TLS credentials otherwise (when TLS is on).
  std::shared_ptr<grpc::ChannelCredentials> CredentialsFor(const std::string& target) const;
  // Adds the server-name override (GRPC_SSL_TARGET_NAME_OVERRIDE_ARG) when one is set.
  void ApplyTo(grpc::ChannelArguments& args) const;
  // A channel to `target` with these credentials and `args` (+ the override).
  std::shared_ptr<grpc::Channel> CreateChannel(const std::string& target,
                                               grpc::ChannelArguments args) const;

 private:
  bool tls_ = false;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;  // shared by every channel made
  std::string server_name_;
  TlsChannelFiles files_;
};

}  // namespace mc
