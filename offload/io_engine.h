// Block I/O for the SSD tier: submit a batch of positioned reads and writes, wait for all of them.
//
// Two engines: io_uring (one ring owned by one thread; callers hand it batches through a queue and
// block on a future until every request of their batch completed) and pread/pwrite (the fallback
// where the kernel refuses io_uring, or where an operator forces it). CreateIoEngine() picks one.
//
// Contract: every request completes with exactly its length in bytes, or with an error. Short
// transfers are resumed until complete; one that makes no progress (a read past end of file, a
// write that writes nothing) is reported as kTransferFailed, never returned as success. Buffers
// must stay valid and untouched until SubmitAndWait returns; on a file opened with O_DIRECT, buffer
// address, offset and length must be 4 KiB-aligned. Engines are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace mc::offload {

enum class IoOp { kRead, kWrite };

struct IoRequest {
  IoOp op = IoOp::kRead;
  int fd = -1;
  uint64_t offset = 0;
  char* buffer = nullptr;  // for kWrite the bytes are only read
  uint64_t length = 0;
};

// Bytes transferred (== the request's length) or the error.
using IoResult = absl::StatusOr<uint64_t>;

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  // Runs every request (in any order, possibly concurrently) and returns one result per request,
  // in request order.
  virtual std::vector<IoResult> SubmitAndWait(std::span<const IoRequest> requests) = 0;
  // "io_uring" or "posix".
  virtual std::string_view Name() const = 0;
};

struct IoEngineOptions {
  int queue_depth = 64;      // io_uring: ring entries and the most requests in flight
  bool force_posix = false;  // skip io_uring
};

// io_uring where the kernel allows it, else pread/pwrite (with a warning).
std::unique_ptr<IoEngine> CreateIoEngine(const IoEngineOptions& options);

// The io_uring engine alone; kUnavailable when io_uring_queue_init fails.
absl::StatusOr<std::unique_ptr<IoEngine>> CreateUringIoEngine(int queue_depth);

// The pread/pwrite engine: requests of a batch run one after another on the calling thread.
std::unique_ptr<IoEngine> CreatePosixIoEngine();

}  // namespace mc::offload
