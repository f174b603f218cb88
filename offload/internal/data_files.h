// The preallocated data files of a DiskTier: created or extended to their configured size,
// opened with O_DIRECT where the filesystem supports it (else buffered, with a warning).
// Immutable after Open; file descriptors are closed on destruction. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mc::offload::internal {

class DataFiles {
 public:
  // `dir` is created if missing; files are `dir`/data-NNN.mcs, each of `file_size` bytes (a
  // multiple of 4 KiB). A file found smaller is extended with zeros; a larger one is left as is
  // and only its first `file_size` bytes are used.
  static absl::StatusOr<std::unique_ptr<DataFiles>> Open(const std::string& dir, int num_files,
                                                         uint64_t file_size, bool direct_io);
  ~DataFiles();
  DataFiles(const DataFiles&) = delete;
  DataFiles& operator=(const DataFiles&) = delete;

  int fd(uint32_t file) const { return fds_[file]; }
  size_t count() const { return fds_.size(); }
  uint64_t file_size() const { return file_size_; }
  bool direct() const { return direct_; }
  // fdatasync of one file.
  absl::Status Sync(uint32_t file) const;

 private:
  DataFiles(uint64_t file_size, bool direct) : file_size_(file_size), direct_(direct) {}

  const uint64_t file_size_;
  bool direct_;
  std::vector<int> fds_;
};

}  // namespace mc::offload::internal
