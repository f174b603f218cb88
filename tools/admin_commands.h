// The commands of mc-admin, the operator CLI, as functions over gRPC stubs so that the main
// stays a thin flag parser. Each command prints its outcome and returns a process exit code
// (0 OK, 1 a per-key failure, 2 usage or connection errors).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "common/auth.h"
#include "mcstore/v1/master.grpc.pb.h"
#include "mcstore/v1/store.grpc.pb.h"

namespace mc::tools {

struct AdminContext {
  mcstore::v1::Master::Stub* master = nullptr;  // for status
  // Standby masters: status asks each in turn until the leader answers (same order as
  // --master's list; `master` is then the first). Empty = `master` alone.
  std::vector<mcstore::v1::Master::Stub*> masters;
  mcstore::v1::Store::Stub* store = nullptr;  // for data commands
  auth::ClusterKeysPtr cluster_keys;          // signs calls to the master; null = none
  uint64_t inline_limit = 4 << 20;            // larger files go through shared memory
  int64_t timeout_ms = 30'000;
  std::string store_token;  // sent as `authorization: Bearer` (the daemon's TCP listener needs it)
  std::string fd_socket;    // the daemon's fd socket, where shared-memory buffers are passed
  FILE* out = stdout;
  FILE* err = stderr;
};

// Writes a fresh cluster secret (common/auth.h NewSecret) to `path`, created with mode 0600;
// refuses to overwrite an existing file.
int CmdGenSecret(const AdminContext& ctx, const std::string& path);
// Writes the member credential of (client_id, serial) to `path` (mode 0600, never overwritten),
// from ctx.cluster_keys (the cluster secret; docs/security.md).
int CmdIssueMember(const AdminContext& ctx, const std::string& client_id, uint64_t serial,
                   const std::string& path);

int CmdStatus(const AdminContext& ctx);
int CmdPut(const AdminContext& ctx, const std::string& file, const std::string& key);
int CmdGet(const AdminContext& ctx, const std::string& key, const std::string& file);
int CmdExist(const AdminContext& ctx, const std::vector<std::string>& keys);
int CmdRemove(const AdminContext& ctx, const std::vector<std::string>& keys);

}  // namespace mc::tools
