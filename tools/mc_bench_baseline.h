// This machine's limits, measured in-process, for reading mc-bench figures as ratios:
// single-thread memcpy of blocks that are not cache-resident (copies out of a source much larger
// than the last-level cache, cycling through offsets) and loopback TCP stream throughput (one
// connection over 127.0.0.1, a sender thread doing large writes). Not thread-safe to run two at
// once (they compete for the same cores and would measure each other).
#pragma once

#include <cstdint>
#include <cstdio>
#include <vector>

namespace mc::bench {

struct BaselineOptions {
  uint64_t source_bytes = 1ull << 30;  // memcpy source; destination is half of it
  std::vector<uint64_t> blocks = {1ull << 20, 4ull << 20, 16ull << 20};
  double seconds = 1.0;                // per measurement
  uint64_t tcp_write_bytes = 1ull << 20;
  int runs = 3;                        // the median is reported
};

struct BaselineResult {
  std::vector<double> memcpy_gbps;  // one per block size, medians
  double tcp_gbps = 0;
};

// Prints one line per run and measurement, then one summary line per figure:
//   mc-bench baseline memcpy block=1048576 GB/s=...   mc-bench baseline tcp ... GB/s=...
BaselineResult RunBaseline(const BaselineOptions& options, FILE* out);

}  // namespace mc::bench
