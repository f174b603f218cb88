// BufferRegistry: the POSIX shared-memory buffers applications register with RegisterBuffer.
//
// Register maps the caller's shm object (its shm_open name) read-write and returns an id;
// Resolve turns (id, offset, length) into memory after an overflow-safe bounds check. A resolved
// buffer is held by a shared_ptr (a BufferRef), so Unregister during a transfer only unmaps once
// the in-flight use ends. Thread-safe.
//
// Shrinking: an application may ftruncate a registered shm object below the mapped size. Any
// access past the new end of the object would raise SIGBUS and kill the daemon. Two defences:
//  - Resolve fstat()s the object (its fd stays open) and refuses a slice the object no longer
//    backs, with INVALID_ARGUMENT;
//  - for the race (the object shrinks while a copy runs), a process-wide SIGBUS handler finds
//    the buffer that holds the faulting address, maps anonymous memory over the whole buffer so
//    the copy can finish harmlessly, and marks the buffer broken. Every user checks Broken()
//    once its copy has ended and fails that item; a broken buffer resolves no more (re-register).
//    Faults outside registered buffers go to the previous handler (default: crash with a core).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace mc::client {

class MappedBuffer {
 public:
  // Takes `fd` (kept open for the size checks) and the mapping; `guard_slot` is the SIGBUS
  // guard's slot for the mapping (see buffer_registry.cc).
  MappedBuffer(std::string name, int fd, char* base, uint64_t size, int guard_slot)
      : name_(std::move(name)), fd_(fd), base_(base), size_(size), guard_slot_(guard_slot) {}
  ~MappedBuffer();
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;
  char* base() const { return base_; }
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }
  // True once an access faulted because the object shrank: the mapping no longer shows the
  // object, and whatever was copied to or from it since is garbage.
  bool Broken() const;
  // OK, or INVALID_ARGUMENT naming the buffer when it is broken (logged once per buffer).
  absl::Status CheckIntact() const;
  // The current size of the shm object, or an error.
  absl::StatusOr<uint64_t> ObjectSize() const;

 private:
  const std::string name_;
  const int fd_;
  char* const base_;
  const uint64_t size_;
  const int guard_slot_;
};
// Shared: a buffer stays mapped while any request still uses it.
using BufferRef = std::shared_ptr<const MappedBuffer>;

// OK when none of `refs` is broken, else the first buffer's error.
absl::Status CheckBuffersIntact(const std::vector<BufferRef>& refs);

// Number of SIGBUS faults the guard absorbed in registered buffers (for /metrics and tests).
uint64_t BufferFaultsAbsorbed();

class BufferRegistry {
 public:
  explicit BufferRegistry(size_t max_buffers = 4096) : max_buffers_(max_buffers) {}

  // Maps `size` bytes of the shm object; size 0 maps the whole object. Errors: missing object,
  // size larger than the object, too many buffers.
  absl::StatusOr<uint64_t> Register(const std::string& shm_name, uint64_t size);
  absl::Status Unregister(uint64_t buffer_id);
  // Memory for [offset, offset + length) of buffer `id`, holding the buffer in `*ref`. Fails
  // (INVALID_ARGUMENT) when the slice is outside the buffer, the shm object no longer backs it,
  // or the buffer is broken.
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
