// mc-admin: the operator CLI.
//   mc-admin --master HOST:PORT status
//   mc-admin --client HOST:PORT put FILE KEY | get KEY FILE | exist KEY... | rm KEY...
// --client also takes unix:PATH (the daemon's --unix_socket). Over TCP the Store token comes from
// --token_file or $MCSTORE_TOKEN_FILE.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "client/buffers/fd_session.h"
#include "common/auth.h"
#include "tools/admin_commands.h"
#include "tools/store_channel.h"
#include "tools/store_channel_flags.h"

ABSL_FLAG(std::string, master, "127.0.0.1:50051",
          "mc-master gRPC HOST:PORT, or a comma list of the masters (status asks the leader)");
ABSL_FLAG(std::string, client, "127.0.0.1:50052", "mc-client Store address (data commands)");
ABSL_FLAG(int64_t, timeout_ms, 30000, "deadline of each RPC");
ABSL_FLAG(std::string, cluster_secret_file, "",
          "the cluster secret file (as mc-master's); signs calls to the master");
ABSL_FLAG(std::string, client_id, "", "issue-member: the client id the credential registers");
ABSL_FLAG(uint64_t, serial, 1,
          "issue-member: the credential's serial (re-issue with a higher one after a revocation)");
ABSL_FLAG(std::string, out, "", "issue-member: the file to write (mode 0600; never overwritten)");
ABSL_FLAG(uint64_t, inline_limit, 4ull << 20, "files above this go through shared memory");
ABSL_FLAG(std::string, token_file, "",
          "file holding the daemon's Store token, needed over TCP (default: $MCSTORE_TOKEN_FILE)");
ABSL_FLAG(std::string, fd_socket, "",
          "the daemon's fd socket for shared memory (default: <PATH>.fd of --client unix:PATH)");

namespace {

constexpr const char* kUsage =
    "usage: mc-admin [--master H:P] [--cluster_secret_file F] status\n"
    "       mc-admin gen-secret FILE   (a new cluster secret, mode 0600)\n"
    "       mc-admin --cluster_secret_file F issue-member --client_id ID [--serial N] --out FILE\n"
    "                                  (a member credential for mc-client, mode 0600)\n"
    "       mc-admin [--client H:P|unix:PATH] put FILE KEY | get KEY FILE | exist KEY... | rm "
    "KEY...";

// TLS (the --tls_* flags) for TCP targets, master and Store alike; unix: stays plaintext.
std::shared_ptr<grpc::Channel> Channel(const std::string& target,
                                       const mc::ChannelSecurity& security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return security.CreateChannel(target, args);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  std::vector<std::string> args(positional.begin() + 1, positional.end());
  if (args.empty()) {
    std::fprintf(stderr, "%s\n", kUsage);
    return 2;
  }
  if (args[0] == "gen-secret" && args.size() == 2) {
    return mc::tools::CmdGenSecret(mc::tools::AdminContext{}, args[1]);
  }
  std::string secret_file = absl::GetFlag(FLAGS_cluster_secret_file);
  mc::auth::ClusterKeysPtr cluster_keys;
  if (!secret_file.empty()) {
    absl::StatusOr<mc::auth::ClusterKeysPtr> loaded = mc::auth::ClusterKeys::Load(secret_file);
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s\n", std::string(loaded.status().message()).c_str());
      return 2;
    }
    cluster_keys = *loaded;
  }
  if (args[0] == "issue-member" && args.size() == 1) {
    mc::tools::AdminContext ctx;
    ctx.cluster_keys = cluster_keys;
    if (absl::GetFlag(FLAGS_client_id).empty() || absl::GetFlag(FLAGS_out).empty()) {
      std::fprintf(stderr, "issue-member: needs --client_id and --out\n");
      return 2;
    }
    return mc::tools::CmdIssueMember(ctx, absl::GetFlag(FLAGS_client_id),
                                     absl::GetFlag(FLAGS_serial), absl::GetFlag(FLAGS_out));
  }
  absl::StatusOr<mc::ChannelSecurity> security = mc::tools::ChannelSecurityFromFlags();
  if (!security.ok()) {
    std::fprintf(stderr, "%s\n", std::string(security.status().message()).c_str());
    return 2;
  }
  std::vector<std::unique_ptr<mcstore::v1::Master::Stub>> masters;
  for (absl::string_view a :
       absl::StrSplit(absl::GetFlag(FLAGS_master), ',', absl::SkipWhitespace())) {
    masters.push_back(mcstore::v1::Master::NewStub(Channel(std::string(a), *security)));
  }
  if (masters.empty()) {
    std::fprintf(stderr, "--master: no address\n");
    return 2;
  }
  auto store = mcstore::v1::Store::NewStub(Channel(absl::GetFlag(FLAGS_client), *security));
  mc::tools::AdminContext ctx;
  ctx.master = masters[0].get();
  for (auto& m : masters) ctx.masters.push_back(m.get());
  ctx.store = store.get();
  ctx.cluster_keys = cluster_keys;
  ctx.timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
  ctx.inline_limit = absl::GetFlag(FLAGS_inline_limit);
  if (auto token = mc::tools::ReadStoreTokenFile(absl::GetFlag(FLAGS_token_file)); token.ok()) {
    ctx.store_token = *std::move(token);
  } else {
    std::fprintf(stderr, "--token_file: %s\n", std::string(token.status().message()).c_str());
    return 2;
  }
  ctx.fd_socket = absl::GetFlag(FLAGS_fd_socket);
  if (ctx.fd_socket.empty()) {
    ctx.fd_socket = mc::client::DefaultFdSocket(absl::GetFlag(FLAGS_client));
  }
  const std::string& cmd = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (cmd == "status" && rest.empty()) return mc::tools::CmdStatus(ctx);
  if (cmd == "put" && rest.size() == 2) return mc::tools::CmdPut(ctx, rest[0], rest[1]);
  if (cmd == "get" && rest.size() == 2) return mc::tools::CmdGet(ctx, rest[0], rest[1]);
  if (cmd == "exist" && !rest.empty()) return mc::tools::CmdExist(ctx, rest);
  if (cmd == "rm" && !rest.empty()) return mc::tools::CmdRemove(ctx, rest);
  std::fprintf(stderr, "%s\n", kUsage);
  return 2;
}
