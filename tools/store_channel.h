// MakeStoreChannel: a Store channel whose every call carries fixed metadata: the Store token
// (`authorization: Bearer ...`, needed over TCP) and the owner token of an fd session whose
// buffers the calls use (`x-mc-owner`); ReadStoreTokenFile: that token, from the tools'
// --token_file or $MCSTORE_TOKEN_FILE; ToolChannelSecurity: the tools' TLS flags (--tls_ca_file,
// --tls_cert_file, --tls_key_file, --tls_server_name) checked and turned into channel
// credentials. See docs/security.md.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_join.h"
#include "common/auth.h"
#include "proto/grpc_tls.h"

namespace mc::tools {

using CallMetadata = std::vector<std::pair<std::string, std::string>>;

class AddCallMetadata final : public grpc::experimental::Interceptor {
 public:
  explicit AddCallMetadata(std::shared_ptr<const CallMetadata> md) : md_(std::move(md)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      auto* sent = methods->GetSendInitialMetadata();
      for (const auto& [key, value] : *md_) sent->emplace(key, value);
    }
    methods->Proceed();
  }

 private:
  std::shared_ptr<const CallMetadata> md_;
};

class AddCallMetadataFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit AddCallMetadataFactory(std::shared_ptr<const CallMetadata> md) : md_(std::move(md)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new AddCallMetadata(md_);
  }

 private:
  std::shared_ptr<const CallMetadata> md_;
};

// `token` and `owner` may be empty (then not sent). `security` applies to TCP targets; unix:
// targets stay plaintext.
inline std::shared_ptr<grpc::Channel> MakeStoreChannel(
    const std::string& target, grpc::ChannelArguments args, const std::string& token,
    const std::string& owner = "", const ChannelSecurity& security = ChannelSecurity()) {
  auto md = std::make_shared<CallMetadata>();
  if (!token.empty()) md->emplace_back("authorization", "Bearer " + token);
  if (!owner.empty()) md->emplace_back("x-mc-owner", owner);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<AddCallMetadataFactory>(md));
  security.ApplyTo(args);
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, security.CredentialsFor(target), args, std::move(factories));
}

// The tools' TLS flags: every problem at once (joined), else the security of their channels.
inline absl::StatusOr<ChannelSecurity> ToolChannelSecurity(const TlsChannelFiles& files) {
  const TlsFlagNames names{.ca = "--tls_ca_file"};
  std::vector<std::string> problems = TlsChannelProblems(files, names);
  if (!problems.empty()) return absl::InvalidArgumentError(absl::StrJoin(problems, "; "));
  return ChannelSecurity::Make(files, names);
}

// The Store token in `flag_path`, or in $MCSTORE_TOKEN_FILE when the flag is empty; "" when
// neither names a file. The file must be private to its owner (auth::ReadPrivateFile: the same
// rule as for the daemons' secret and token files), so a token another user can read is refused
// with an error that says how to fix it.
inline absl::StatusOr<std::string> ReadStoreTokenFile(std::string flag_path) {
  if (flag_path.empty()) {
    const char* env = std::getenv("MCSTORE_TOKEN_FILE");
    if (env != nullptr) flag_path = env;
  }
  if (flag_path.empty()) return std::string();
  return auth::ReadPrivateFile(flag_path);
}

}  // namespace mc::tools
