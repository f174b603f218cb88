// EtcdKv over etcd's v3 JSON gateway (POST /v3/lease/grant, /v3/lease/keepalive,
// /v3/lease/revoke, /v3/kv/txn, /v3/kv/range; keys and values base64, int64 fields as JSON
// strings), with cpp-httplib. Endpoints are tried in turn, starting at the last one that
// answered. It parses only the few fields it needs. Thread-safe (one request at a time).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "master/leader_election.h"

namespace mc::master {

struct EtcdHttpOptions {
  std::vector<std::string> endpoints;  // http://HOST:PORT each
  int64_t timeout_ms = 1000;           // connect and read, per request and endpoint
};

absl::StatusOr<std::unique_ptr<EtcdKv>> CreateEtcdHttpKv(const EtcdHttpOptions& options);

namespace internal {
// The value of the first `"name":` field at or after `from` in JSON text, unquoted; nullopt
// when absent. Enough for etcd's flat answers (no escapes occur in base64, numbers, booleans).
std::optional<std::string> JsonField(const std::string& json, const std::string& name,
                                     size_t from = 0);
}  // namespace internal

}  // namespace mc::master
