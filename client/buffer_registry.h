// BufferRegistry: the POSIX shared-memory buffers applications register with RegisterBuffer.
//
// Register maps the caller's shm object (its shm_open name) read-write and returns an id;
// Resolve turns (id, offset, length) into memory after an overflow-safe bounds check. A resolved
// buffer is held by a shared_ptr (a BufferRef), so Unregister during a transfer only unmaps once
// the in-flight use ends. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace mc::client {

class MappedBuffer {
 public:
  MappedBuffer(std::string name, char* base, uint64_t size) : name_(std::move(name)), base_(base), size_(size) {}
  ~MappedBuffer();
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;
  char* base() const { return base_; }
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  const std::string name_;
  char* const base_;
  const uint64_t size_;
};
// Shared: a buffer stays mapped while any request still uses it.
using BufferRef = std::shared_ptr<const MappedBuffer>;

class BufferRegistry {
 public:
  explicit BufferRegistry(size_t max_buffers = 4096) : max_buffers_(max_buffers) {}

  // Maps `size` bytes of the shm object; size 0 maps the whole object. Errors: missing object,
  // size larger than the object, too many buffers.
  absl::StatusOr<uint64_t> Register(const std::string& shm_name, uint64_t size);
  absl::Status Unregister(uint64_t buffer_id);
  // Memory for [offset, offset + length) of buffer `id`, holding the buffer in `*ref`.
  absl::StatusOr<char*> Resolve(uint64_t buffer_id, uint64_t offset, uint64_t length,
                                BufferRef* ref) const;
  size_t Count() const;

 private:
  const size_t max_buffers_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, BufferRef> buffers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mc::client
