// Who may touch memory registered with the transfer engine (TransferEngine::RegisterMemory).
#pragma once

#include <cstdint>

namespace mc::transfer {

// kLocal: only this process's own requests use the memory as their local buffers (an application
// buffer): an rdma memory region without remote access, whose rkey is never told to peers.
// kRemote: also the target of peers' one-sided READ/WRITE (a segment this daemon serves).
enum class MemoryAccess : uint8_t { kLocal, kRemote };

}  // namespace mc::transfer
