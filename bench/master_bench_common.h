// What the master benchmarks (master_bench.cc, and its fleet in master_bench_fleet.cc) share: the
// keys they preload, their size, whether the master authenticates, and the check of an answer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "mcstore/v1/master.pb.h"

namespace mc::master::bench {

inline constexpr uint64_t kObjectSize = 4096;

// Set from MC_BENCH_MASTER_AUTH in main (default on, as mc-master runs).
inline bool g_master_auth = true;

// Keys look like KV-block hashes: 32 bytes.
inline std::string KeyOf(size_t i) {
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016zx%016zx", static_cast<size_t>(i * 0x9E3779B97F4A7C15ull),
                i);
  return std::string(buf, 32);
}

// Whether every requested key was answered OK (the benchmarks look up preloaded keys only).
inline bool AllRepliesFound(const mcstore::v1::GetReplicasRequest& req,
                            const mcstore::v1::GetReplicasResponse& resp) {
  const int asked = req.keys_size() > 0 ? req.keys_size() : req.packed_key_sizes_size();
  if (req.count_only() || req.stop_at_first_miss()) {
    return resp.matched() == static_cast<uint32_t>(asked);
  }
  if (req.packed()) {
    if (resp.packed().codes_size() != asked) return false;
    for (int c : resp.packed().codes()) {
      if (c != mcstore::v1::OK) return false;
    }
    return true;
  }
  if (resp.results_size() != asked) return false;
  for (const auto& r : resp.results()) {
    if (r.code() != mcstore::v1::OK) return false;
  }
  return true;
}

}  // namespace mc::master::bench
