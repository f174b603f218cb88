// The MatchPrefix workload of mc-bench: puts `chain` small values under chained keys (each key a
// hash over its predecessor, like KV-cache block keys), then times MatchPrefix over the whole
// chain (every key stored: matched must equal the chain length), optionally taking a lease and
// releasing it, and prints one line per run plus a summary of the medians; removes its keys.
// Not thread-safe: one RunPrefixBench at a time per process.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "proto/grpc_tls.h"

namespace mc::bench {

struct PrefixBenchOptions {
  std::string client;          // Store address (HOST:PORT or unix:PATH)
  std::string store_token;     // sent with every call (TCP Store listeners need it)
  ChannelSecurity security;    // TLS towards TCP targets (--tls_ca_file ...); default plaintext
  int chain = 1000;            // keys in the chain (one MatchPrefix names them all)
  uint64_t value_size = 4096;  // bytes per value put under each key
  int iterations = 200;        // timed MatchPrefix RPCs per run
  int warmup = 5;              // untimed ones before each run's timing
  int runs = 1;
  uint32_t lease_ttl_ms = 0;  // > 0: each MatchPrefix takes a lease (released right after)
  bool packed_keys = true;    // send the keys packed (falls back to one by one if unread)
  std::string key_prefix;     // empty = "mcp-<pid>"
  int64_t timeout_ms = 60'000;
  bool keep = false;  // leave the keys stored
  bool fast = true;   // MatchPrefix over <PATH>.fast of a unix:PATH client when it exists
};

// Returns 0 when every MatchPrefix matched the whole chain, 1 otherwise, 2 on setup errors.
int RunPrefixBench(const PrefixBenchOptions& options, FILE* out);

}  // namespace mc::bench
