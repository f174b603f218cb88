// RemoteDma: one-sided transfers between registered local memory and peers' memory segments, as
// another transport uses them. The cuda transport hands its GPUDirect RDMA reads and writes of
// GPU memory to whatever implements this (the rdma transport, wired by the registry), without
// depending on it: transports do not include each other (tests/repo/layering_test.py).
// Thread-safety: every method may be called concurrently.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "transfer/transfer_request.h"

namespace mc::transfer {

class RemoteDma {
 public:
  virtual ~RemoteDma() = default;

  // Device memory [device_addr, device_addr + length), exported as the dma-buf `dmabuf_fd`
  // (borrowed; the caller may close it once this returned), becomes local memory that requests
  // may name as their local buffers (local access only: never served to peers). Released with
  // UnregisterMemory(device_addr).
  virtual absl::Status RegisterDeviceMemory(uint64_t device_addr, uint64_t length,
                                            int dmabuf_fd) = 0;
  // Blocks until no request uses the memory registered at `base`, then releases it.
  virtual void UnregisterMemory(void* base) = 0;
  // True when every local buffer of `request` lies inside registered memory.
  virtual bool LocalBuffersRegistered(const TransferRequest& request) const = 0;
  // True when the peer is connected, or a connection setup to it succeeds now.
  virtual bool PeerReachable(const std::string& endpoint) = 0;
  // Moves segment-range requests whose local buffers are registered, as Transport::Submit does
  // (one result per request, never a short OK, the deadline honoured). A request asking for
  // Proof::kDeliveredBytes is hashed on the CPU: one into device memory must not ask.
  virtual void Submit(std::span<const TransferRequest* const> requests,
                      std::span<TransferResult> results, int64_t deadline_ms) = 0;
};

}  // namespace mc::transfer
