// Who may touch memory registered with the transfer engine, and the registrar seam: memory is
// registered only through the engine (TransferEngine implements MemoryRegistrar), which hands
// it to every transport that needs it.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace mc::transfer {

// kLocal: only this process's own requests use the memory as their local buffers (an application
// buffer): an rdma memory region without remote access, whose rkey is never told to peers.
// kRemote: also the target of peers' one-sided READ/WRITE (a segment this daemon serves).
enum class MemoryAccess : uint8_t { kLocal, kRemote };

// Registers memory with the transports that need it (an rdma memory region, a pinned segment).
// Thread-safe.
class MemoryRegistrar {
 public:
  virtual ~MemoryRegistrar() = default;
  // [base, base + length) until UnregisterMemory(base); an error leaves nothing registered.
  virtual absl::Status RegisterMemory(void* base, uint64_t length, MemoryAccess access) = 0;
  // Blocks until no transfer uses the memory any more, then releases it.
  virtual void UnregisterMemory(void* base) = 0;
};

}  // namespace mc::transfer
