// GpuPutStager: lets a BatchPut item take its bytes from GPU memory (issue 18).
//
// The put path hashes and writes from host memory, so an item with GPU pieces is first staged
// into one host buffer that this daemon allocates: each GPU piece copied by the GPU mover, with
// the device hashing the piece's *source* after the copy on the same stream; host pieces (an
// item may mix them, e.g. a vLLM block's header and its KV runs) copied by the CPU. The staged
// bytes become the item's source only when every GPU piece's CPU XXH3-64 equals its device
// hash; the object's checksum is then a hash of exactly what the device held. A copy that failed,
// ran past the deadline, was short or was changed underneath (the application wrote its buffer
// during the put) fails its item (TRANSFER_FAILED, or CHECKSUM_MISMATCH: never stored, never "the
// copy returned success"), and the rest of the batch goes on.
//
// Bounds: the host memory staged at once, over all requests, is at most `max_staging_bytes`;
// an item that does not fit beside the staging in progress fails UNAVAILABLE (retry) and one
// larger than the whole budget fails INVALID_ARGUMENT. The memory is released when the Staged
// returned by Stage() goes (after the put), except when the device was declared lost during the
// copies (GpuMover: streams that never drained may still write into it): then it is never freed.
//
// Cost: one extra copy (device -> staging -> segment) and two hashes (device and CPU) per
// item; a put straight from device memory into a pinned local segment would save the copy and
// is not done.
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "client/batch_types.h"
#include "common/clock.h"

namespace mc::transfer::cuda {
class GpuMover;
}  // namespace mc::transfer::cuda

namespace mc::client {

struct GpuPutStagerOptions {
  uint64_t max_staging_bytes = uint64_t{1} << 30;  // host memory staged at once, all requests
  int64_t copy_timeout_ms = 10'000;                // one Stage()'s copies and hashes
};

class GpuPutStager {
 public:
  // The staging memory of one request; frees it (and its share of the budget) when it goes.
  class Staged {
   public:
    Staged() = default;
    ~Staged();
    Staged(Staged&& other) noexcept;
    Staged& operator=(Staged&&) = delete;
    Staged(const Staged&) = delete;
    uint64_t bytes() const { return bytes_; }

   private:
    friend class GpuPutStager;
    std::atomic<uint64_t>* in_use_ = nullptr;
    uint64_t bytes_ = 0;
    std::vector<std::unique_ptr<char[]>> buffers_;
  };

  // `mover` (borrowed) copies and hashes on the device of the GPU buffers.
  GpuPutStager(transfer::cuda::GpuMover& mover, GpuPutStagerOptions options, const Clock& clock);

  // For every item with GPU pieces: stages it and points `pieces` at the verified host copy
  // (and sets `checksum`), or sets `input_error`. Items without GPU pieces are left alone.
  Staged Stage(std::vector<PutRequestItem>& items);

  uint64_t staged_bytes_in_use() const { return in_use_.load(); }

 private:
  transfer::cuda::GpuMover& mover_;
  const GpuPutStagerOptions options_;
  const Clock& clock_;
  std::atomic<uint64_t> in_use_{0};
};

}  // namespace mc::client
