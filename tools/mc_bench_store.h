// The Store workload of mc-bench: puts `keys` distinct values through one mc-client daemon, gets
// them (with chosen hit and duplicate ratios) through the same or another daemon into slices of
// one registered POSIX shared-memory buffer (or inline), checks every byte it got, removes what
// it put, and prints one line per run plus a summary of the medians.
// Not thread-safe: one RunStoreBench at a time per process (it owns its worker threads).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include <vector>
#include "proto/grpc_tls.h"

namespace mc::bench {

struct StoreBenchOptions {
  std::string client;         // daemon gets go through (HOST:PORT or unix:PATH)
  std::string put_client;     // daemon puts go through; empty = `client`
  std::string store_token;    // sent with every call (TCP Store listeners need it)
  ChannelSecurity security;   // TLS towards TCP targets (--tls_ca_file ...); default plaintext
  std::string fd_socket;      // `client`'s fd socket; empty = <PATH>.fd of unix:PATH
  std::string put_fd_socket;  // `put_client`'s; empty = likewise
  uint64_t value_size = 1ull << 20;
  int batch = 16;              // items per RPC
  int keys = 64;               // distinct keys put per run
  double duplicate_ratio = 0;  // fraction of get items repeating a key of the same batch
  double hit_ratio = 1;        // fraction of (non-duplicate) get items naming a stored key
  int threads = 1;
  int iterations = 20;          // get RPCs per thread per run (when seconds == 0)
  double seconds = 0;           // > 0: run gets this long per thread per run instead
  double get_gap_ms = 0;        // idle time before each get (an engine's loads are apart)
  bool measure_put = true;      // report the put phase
  bool measure_get = true;      // run and report the get phase
  bool shm = true;              // slices of a registered shm buffer; false: inline bytes
  // Puts (and shm gets) over the fast channel (<PATH>.fast of a unix:PATH target) when its
  // socket exists; false: gRPC only.
  bool fast = true;
  bool verify = true;           // check every byte got against the expected pattern
  int runs = 1;                 // the summary reports medians over runs
  int warmup = 1;               // untimed get RPCs per thread before each run's timing
  std::string key_prefix;       // empty = "mcb-<pid>"
  int64_t timeout_ms = 60'000;  // deadline of each RPC
  bool keep = false;            // leave the keys of the last run stored
  bool stored = false;          // get the keys a --keep run left: no put, no removal
  uint64_t seed = 1;
  std::vector<int> cpu_pids;  // processes (the daemons) whose CPU per GB moved is printed too
};

// Returns 0 when every item ended as expected and verified, 1 otherwise, 2 on setup errors.
int RunStoreBench(const StoreBenchOptions& options, FILE* out);

}  // namespace mc::bench
