// Small statistics and formatting helpers shared by mc-bench and the peer benchmark clients:
// latency percentiles, the median of repeated runs, CPU seconds of processes and the --cpu_pids
// list. Thread-safe.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

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

// CPU seconds (user + system) this process has used so far.
inline double OwnCpuSeconds() {
  struct rusage u {};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

// CPU seconds (user + system, its threads included) process `pid` has used so far, from
// /proc/PID/stat; a negative value when it cannot be read (gone, not ours to read).
inline double ProcessCpuSeconds(int pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return -1;
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // The command name (field 2) may hold spaces and parentheses: count fields after the last ')'.
  std::string stat(buf);
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  unsigned long long utime = 0, stime = 0;
  // Fields 3.. follow ") ": state ppid pgrp session tty tpgid flags minflt cminflt majflt
  // cmajflt utime stime.
  if (std::sscanf(stat.c_str() + close + 1,
                  " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2) {
    return -1;
  }
  long ticks = sysconf(_SC_CLK_TCK);
  return ticks > 0 ? static_cast<double>(utime + stime) / static_cast<double>(ticks) : -1;
}

// The pids of a comma-separated list (`--cpu_pids`; empty parts skipped) into *pids; false, with
// the offending part in *bad, when a part is not a positive integer.
inline bool ParsePids(absl::string_view list, std::vector<int>* pids, std::string* bad) {
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int pid = 0;
    if (!absl::SimpleAtoi(part, &pid) || pid <= 0) {
      *bad = std::string(part);
      return false;
    }
    pids->push_back(pid);
  }
  return true;
}

// The summed CPU seconds of `pids` (negative when any cannot be read; none: 0).
inline double ProcessesCpuSeconds(const std::vector<int>& pids) {
  double sum = 0;
  for (int pid : pids) {
    double s = ProcessCpuSeconds(pid);
    if (s < 0) return -1;
    sum += s;
  }
  return sum;
}

}  // namespace mc::bench
