// Small utilities shared by the daemons and tools: host:port parsing, the --ready_file writer,
// human-readable byte counts. Thread-safe: all functions are pure or touch only their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mc {

struct HostPort {
  std::string host;
  int port = 0;
};
// "host:port" or "[v6]:port"; port 0..65535.
absl::StatusOr<HostPort> ParseHostPort(std::string_view text);

// Writes {"k": "v", ...} to `path` atomically (temp file + rename), so readers never see half.
absl::Status WriteReadyFile(const std::string& path,
                            const std::vector<std::pair<std::string, std::string>>& fields);

// A byte count: digits with an optional 1024-based suffix K, M, G or T (case-insensitive, with
// an optional "iB"/"B": "65536", "64K", "16MiB", "1g"). INVALID_ARGUMENT on anything else or on
// overflow.
absl::StatusOr<uint64_t> ParseBytes(std::string_view text);
// The same for flag parsing: false (and *out untouched) on a bad count.
bool ParseBytes(std::string_view text, uint64_t* out);

// Turns off absl::Mutex's lock-order (deadlock) detection for the whole process. Debian builds
// Abseil without NDEBUG, which leaves the detection on: every Lock() then updates a global graph
// under a global spinlock (3x the cost of a nested lock pair here), in our code and in gRPC's,
// whose mutexes are absl::Mutex. The daemons and tools call this first thing in main(); unit
// tests keep the detection on, so a lock-order cycle still aborts there.
void DisableMutexDeadlockDetection();

// `path` made absolute against the working directory ("" stays ""; absolute paths unchanged).
std::string AbsolutePath(const std::string& path);

// 1024-based units with two decimals: "0 B", "512 B", "1.50 KB", "940.90 GB", "1.00 TB".
std::string FormatBytes(uint64_t bytes);

}  // namespace mc
