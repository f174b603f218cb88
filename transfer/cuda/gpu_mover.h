// The GPU mover: moves many small blocks between device memory and pinned host memory (local
// segments) through the CudaApi seam, without a launch per block, and proves device
// destinations by hashing them on the device.
//
// A Move() call takes a batch of requests, each a list of copies (device <-> host) and,
// optionally, a device-side XXH3-64 of its destination (one contiguous device range), or of its
// source (a copy out of device memory), to return or to compare with an expected value. The copies
// are spread over up to `streams_per_move` streams, contiguous runs of requests per stream balanced
// by bytes, and enqueued as batched submissions of up to `max_ops_per_batch` copies (one
// cudaMemcpyBatchAsync each); then one kernel launch per stream hashes every destination that asked
// for it. An event after each submission tells which copies are known to have landed.
//
// What a result promises: `bytes` is the sum of the request's copies whose submission
// completed without error (a failed submission counts nothing of its copies: CUDA does not say
// which of them landed); the status is OK only when every copy of the request completed and,
// where a hash was asked for, the hash kernel completed (and matched `expected_checksum` when
// given). Failures: kTransferFailed ("cuda: ..." or "deadline"), kChecksumMismatch on a checksum
// mismatch, kUnavailable once the device was declared lost.
//
// Deadlines: Move() returns the deadline error for unfinished requests once `deadline_ms`
// passed. Copies cannot be cancelled, so before returning it waits up to `drain_grace_ms` for
// its streams to go idle (a caller may then reuse or free the memory: no later byte lands);
// if they do not, the device is declared lost: the streams are abandoned, every later Move()
// fails kUnavailable and the error says bytes may still land.
// Thread-safety: Move() may run concurrently; each call owns the streams it took.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "transfer/cuda/cuda_api.h"

namespace mc::transfer::cuda {

struct GpuMoverOptions {
  int device = 0;                         // CUDA ordinal of the device memory this mover serves
  int streams = 4;                        // streams owned by the mover (shared by all callers)
  int streams_per_move = 4;               // most streams one Move() spreads its copies over
  uint32_t max_ops_per_batch = 1024;      // copies per batched submission
  uint32_t max_hashes_per_stream = 4096;  // destinations one stream hashes per Move (grows)
  int64_t drain_grace_ms = 5000;          // after a deadline or error: wait this long for idle
  int poll_interval_us = 10;              // sleep between event polls (0 = spin)
  Clock* clock = nullptr;                 // null = RealClock
};

struct GpuMoveRequest {
  std::vector<CopyOp> copies;  // destination bytes = the sum of their lengths
  // Hash the destination on the device: requires exactly one copy whose dst is device memory.
  bool hash_destination = false;
  // Hash the source on the device instead (a copy out of device memory, e.g. a put staged into
  // host memory): requires exactly one copy whose src is device memory; not with
  // hash_destination. The hash runs after the copy, on the same stream.
  bool hash_source = false;
  // With hash_destination: copies[0].dst is device memory that something else already wrote (a
  // NIC, over GPUDirect RDMA): nothing is copied (src is unused), the range is only hashed, and
  // the result's `bytes` stays 0.
  bool hash_only = false;
  // With a hash: the result is OK only when the hash equals this.
  std::optional<uint64_t> expected_checksum;
};

struct GpuMoveResult {
  absl::Status status;
  uint64_t bytes = 0;
  // The device hash of the destination (or source, with hash_source), when OK and asked.
  std::optional<uint64_t> checksum;
};

class GpuMover {
 public:
  static absl::StatusOr<std::unique_ptr<GpuMover>> Create(CudaApi& api, GpuMoverOptions options);
  ~GpuMover();
  GpuMover(const GpuMover&) = delete;
  GpuMover& operator=(const GpuMover&) = delete;

  // One result per request, in order. Blocks until all finished or the deadline (steady ms of
  // the clock, 0 = none) passed, plus at most drain_grace_ms (see above). Memory named by the
  // copies must stay valid until it returns.
  std::vector<GpuMoveResult> Move(std::span<const GpuMoveRequest> requests, int64_t deadline_ms);

  // Counters for tests and metrics.
  uint64_t batches_submitted() const;
  uint64_t hash_launches() const;
  bool device_lost() const;

 private:
  struct Lane;  // a stream with its pinned descriptor/result scratch
  struct Plan;
  GpuMover(CudaApi& api, GpuMoverOptions options);
  // Takes 1..streams_per_move idle lanes (waits for one); empty when the device is lost.
  std::vector<Lane*> AcquireLanes(size_t wanted);
  void ReleaseLanes(std::span<Lane* const> lanes, bool abandoned);
  absl::Status EnsureHashCapacity(Lane& lane, uint32_t count);
  void Enqueue(Plan& plan, size_t lane_index, std::span<const GpuMoveRequest> requests);
  void Wait(Plan& plan, int64_t deadline_ms);
  // Move()'s steps. Validate: plan.invalid per request; returns how many are valid, adds their
  // bytes to `total`. AssignToLanes: spreads the valid requests over plan.lanes. Drain: false
  // when a stream did not go idle within drain_grace_ms (the device is then lost). Collect: each
  // request's bytes, checksum and status from the lanes' outcome.
  static size_t Validate(std::span<const GpuMoveRequest> requests, Plan& plan, uint64_t& total);
  static void AssignToLanes(std::span<const GpuMoveRequest> requests, uint64_t total, Plan& plan);
  bool Drain(Plan& plan);
  void Collect(Plan& plan, std::span<const GpuMoveRequest> requests, bool abandoned,
               std::vector<GpuMoveResult>& results);

  CudaApi& api_;
  const GpuMoverOptions options_;
  Clock& clock_;
  std::vector<std::unique_ptr<Lane>> lanes_;  // fixed after Create

  mutable absl::Mutex mu_;
  std::vector<Lane*> idle_ ABSL_GUARDED_BY(mu_);
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t batches_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t hash_launches_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mc::transfer::cuda
