// Small statistics and formatting helpers shared by mc-bench and the peer benchmark clients:
// latency percentiles and the median of repeated runs. Pure functions; thread-safe.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace mc::bench {

struct LatencySummary {
  double p50_ms = 0, p90_ms = 0, p99_ms = 0, max_ms = 0;
};

// Nearest-rank percentiles of per-RPC latencies in milliseconds (empty input: all zero).
inline LatencySummary Summarize(std::vector<double> ms) {
  LatencySummary s;
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) {
    size_t i = static_cast<size_t>(q * static_cast<double>(ms.size()));
    return ms[std::min(i, ms.size() - 1)];
  };
  s.p50_ms = at(0.50);
  s.p90_ms = at(0.90);
  s.p99_ms = at(0.99);
  s.max_ms = ms.back();
  return s;
}

// Median (mean of the two middle values for an even count; 0 for none).
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

inline double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace mc::bench
