// EtcdKv over etcd's v3 JSON gateway (POST /v3/lease/grant, /v3/lease/keepalive,
// /v3/lease/revoke, /v3/kv/txn, /v3/kv/range; keys and values base64, int64 fields as JSON
// strings), with cpp-httplib. Endpoints are tried in turn, starting at the last one that
// answered. It parses only the few fields it needs. Thread-safe (one request at a time).
//
// Security: https:// endpoints verify the server's certificate (against `ca_file`, else the
// system's CAs) and may present a client certificate (etcd --client-cert-auth); with `user`,
// it authenticates (POST /v3/auth/authenticate) and sends the token in `Authorization`, taking
// a new one when etcd answers that the token is invalid or expired. Whoever can write the
// election key can make a master stand down or lead, so production etcd wants both.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "master/leader_election.h"

namespace mc::master {

struct EtcdHttpOptions {
  std::vector<std::string> endpoints;  // http://HOST:PORT or https://HOST:PORT each
  int64_t timeout_ms = 1000;           // connect and read, per request and endpoint
  std::string ca_file;                 // https: CA bundle for etcd's certificate (empty: system)
  std::string cert_file, key_file;     // https: client certificate and key (both or neither)
  std::string user, password;          // etcd authentication (empty user: none)
};

absl::StatusOr<std::unique_ptr<EtcdKv>> CreateEtcdHttpKv(const EtcdHttpOptions& options);

namespace internal {
// The value of the first `"name":` field at or after `from` in JSON text, unquoted; nullopt
// when absent. Enough for etcd's flat answers (no escapes occur in base64, numbers, booleans).
std::optional<std::string> JsonField(const std::string& json, const std::string& name,
                                     size_t from = 0);
}  // namespace internal

}  // namespace mc::master
