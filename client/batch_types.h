// Domain types of the Store batch paths, shared by BatchPutter, BatchGetter and the gRPC layer.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "client/buffer_registry.h"
#include "client/gpu_buffers.h"
#include "common/checked_math.h"
#include "transfer/transfer_engine.h"

namespace mc::client {

using transfer::LocalBuffer;

// One put: the payload is the concatenation of `pieces` (inline bytes or registered slices).
struct PutRequestItem {
  std::string_view key;
  std::vector<LocalBuffer> pieces;
  absl::Status input_error;  // set by the caller when the item is already known bad
  // The registered buffers `pieces` lie in (none for inline data): checked once the copies
  // ended, since a buffer whose shm object shrank mid-copy yields void bytes (see BufferRegistry).
  std::vector<BufferRef> buffers;
  // Set: `pieces` is one range of registered GPU memory (client/gpu_buffers.h), held for the
  // request. The put path never reads it: GpuPutStager replaces it with a verified host copy
  // (or fails the item) before the put starts.
  GpuBufferRef gpu;
  // Set by GpuPutStager with that copy: the XXH3-64 of exactly `pieces`, which the putter then
  // uses instead of hashing them again.
  std::optional<uint64_t> checksum;
};

// One get: destination slices, or (inline) memory the sink provides once the size is known.
struct GetRequestItem {
  std::string_view key;
  bool inline_data = false;
  std::vector<LocalBuffer> slices;
  absl::Status input_error;
  std::vector<BufferRef> buffers;  // as PutRequestItem::buffers
  // Set: `slices` is one range of registered GPU memory (client/gpu_buffers.h), held for the
  // request. The CPU never touches it: it is read only through the cuda transport, from this
  // daemon's own memory, and is OK only with the transport's device hash (see BatchGetter).
  GpuBufferRef gpu;
};

struct GetItemResult {
  absl::Status status;
  uint64_t size = 0;
  uint64_t bytes_written = 0;
};

// Gives inline gets their destination memory once the object size is known.
class InlineSink {
 public:
  virtual ~InlineSink() = default;
  // Memory for `size` bytes of item `item`, or nullptr (the item then fails INVALID_ARGUMENT).
  virtual char* Allocate(size_t item, uint64_t size) = 0;
};

// Saturates rather than wraps: ResolveSlices refuses slices whose lengths overflow, and a
// saturated size fails every later size check.
inline uint64_t TotalLength(const std::vector<LocalBuffer>& pieces) {
  uint64_t n = 0;
  for (const LocalBuffer& p : pieces) n = SaturatingAdd(n, p.length);
  return n;
}

}  // namespace mc::client
