// Recovery scan of one data file: finds the records whose header and payload checksums verify.
// A page that does not start with the record magic is free space; a page that does but fails
// verification (bad header, payload checksum, or a record running past the end of the file) is
// counted as skipped. Runs before the tier serves, on the caller's thread.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "offload/io_engine.h"
#include "offload/record_format.h"

namespace mc::offload::internal {

struct RecoveredRecord {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t record_size = 0;
  RecordHeader header;
};

struct ScanResult {
  std::vector<RecoveredRecord> records;
  uint64_t skipped_corrupt = 0;
};

// Scans [0, size) of `fd`. Fails only on an I/O error.
absl::StatusOr<ScanResult> ScanDataFile(IoEngine& engine, int fd, uint32_t file, uint64_t size);

// Whether `payload_len` bytes at `offset` of `fd` have XXH3 `expected` (read in chunks).
absl::StatusOr<bool> VerifyPayloadOnDisk(IoEngine& engine, int fd, uint64_t offset,
                                         uint64_t payload_len, uint64_t expected);

}  // namespace mc::offload::internal
