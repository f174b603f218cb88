// Block I/O for the SSD tier: submit a batch of positioned reads and writes, then wait for all of
// them, either in one call (SubmitAndWait) or apart (Submit, then IoBatch::Wait), so a caller can
// prepare its next batch while the device works on this one.
//
// Two engines: io_uring (one ring owned by one thread; callers hand it batches through a queue,
// kick the ring thread awake through an eventfd, and wait on a future until every request of their
// batch completed) and pread/pwrite (the fallback where the kernel refuses io_uring, or where an
// operator forces it: SubmitAndWait runs on the calling thread, Submit on a few worker threads).
// CreateIoEngine() picks one.
//
// Contract: every request completes with exactly its length in bytes, or with an error. Short
// transfers are resumed until complete; one that makes no progress (a read past end of file, a
// write that writes nothing) is reported as kTransferFailed, never returned as success. Buffers
// must stay valid and untouched until SubmitAndWait returns, or until the IoBatch that Submit
// returned has been waited for or destroyed (its destructor waits); the request array itself may
// go once Submit returns. On a file opened with O_DIRECT, buffer address, offset and length must
// be 4 KiB-aligned. Engines are thread-safe; one IoBatch is used by one thread.
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

// A submitted batch. Wait() returns one result per request, in request order, once all of them
// completed; call it at most once. The destructor waits for completion when Wait() was not called,
// so the batch's buffers are free once its IoBatch is gone (an early return cannot leave I/O in
// flight into memory that is reused).
class IoBatch {
 public:
  virtual ~IoBatch() = default;
  virtual std::vector<IoResult> Wait() = 0;
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  // Runs every request (in any order, possibly concurrently) and returns one result per request,
  // in request order.
  virtual std::vector<IoResult> SubmitAndWait(std::span<const IoRequest> requests) = 0;
  // Starts every request and returns without waiting for them (io_uring: on the ring thread;
  // posix: on worker threads); the default, for engines that only wrap SubmitAndWait, runs it
  // before returning an already completed batch.
  virtual std::unique_ptr<IoBatch> Submit(std::span<const IoRequest> requests);
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

// The pread/pwrite engine: SubmitAndWait runs the requests of a batch one after another on the
// calling thread; Submit queues them to 4 worker threads (started on first use).
std::unique_ptr<IoEngine> CreatePosixIoEngine();

}  // namespace mc::offload
