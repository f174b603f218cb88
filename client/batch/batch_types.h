// Domain types of the Store batch paths, shared by BatchPutter, BatchGetter and the gRPC layer.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "client/buffers/buffer_registry.h"
#include "client/gpu/gpu_buffers.h"
#include "common/checked_math.h"
#include "transfer/transfer_engine.h"

namespace mc::client {

using transfer::LocalBuffer;

// The slices of one item that lie in registered GPU memory (client/gpu/gpu_buffers.h), their
// buffers held for the request. The CPU never reads or writes those slices.
struct GpuSlices {
  std::vector<GpuBufferRef> refs;  // one per GPU slice
  // Once the item has a GPU slice: per slice of the item (in order), whether it is GPU memory.
  std::vector<bool> on_device;
  bool empty() const { return refs.empty(); }
  // The item is exactly one slice, in GPU memory (the cuda transport's direct path).
  bool single() const { return refs.size() == 1 && on_device.size() == 1; }
  // Records slice `index` of the item (host or GPU; `ref` set for GPU).
  void Add(size_t index, GpuBufferRef ref) {
    if (ref == nullptr && refs.empty()) return;  // all host so far: nothing to record
    on_device.resize(index, false);
    on_device.push_back(ref != nullptr);
    if (ref != nullptr) refs.push_back(std::move(ref));
  }
};

// One put: the payload is the concatenation of `pieces` (inline bytes or registered slices).
struct PutRequestItem {
  std::string_view key;
  std::vector<LocalBuffer> pieces;
  absl::Status input_error;  // set by the caller when the item is already known bad
  // The registered buffers `pieces` lie in (none for inline data): checked once the copies
  // ended, since a buffer whose shm object shrank mid-copy yields void bytes (see BufferRegistry).
  std::vector<BufferRef> buffers;
  // Pieces in registered GPU memory. The CPU never reads them: GpuPutStager replaces the
  // item's pieces with a verified host copy (or fails the item) before the put starts, except
  // for a direct put (below).
  GpuSlices gpu;
  // Set by GpuPutStager with that copy: the XXH3-64 of exactly `pieces`, which the putter then
  // uses instead of hashing them again; for a direct put, the device hash of its GPU slice.
  std::optional<uint64_t> checksum;
  // Set by GpuPutStager: `pieces` is one GPU slice, written to each replica by the cuda
  // transport and proved against `checksum`, or staged by the BatchPutter where it cannot be.
  bool gpu_direct = false;
};

// One get: destination slices, or (inline) memory the sink provides once the size is known.
struct GetRequestItem {
  std::string_view key;
  bool inline_data = false;
  std::vector<LocalBuffer> slices;
  absl::Status input_error;
  std::vector<BufferRef> buffers;  // as PutRequestItem::buffers
  // Slices in registered GPU memory. The CPU never touches them: they are filled by the cuda
  // transport or the GPU mover and are OK only with a device hash (see BatchGetter).
  GpuSlices gpu;
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
