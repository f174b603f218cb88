// One way of moving bytes (local memcpy, tcp, later rdma/cuda), behind the TransferEngine.
//
// The engine validates requests (non-empty, no length overflow), groups them per transport and
// hands each transport its share of the batch. A transport fills one result per request it was
// given; it must never report OK unless exactly the request's total local length moved, and
// must honour the deadline (kTransferFailed "deadline"). Implementations are thread-safe:
// Submit() may run concurrently from many threads.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "transfer/transfer_engine.h"

namespace mc::transfer {

// Sum of the local buffer lengths of `request` (the engine has checked it does not overflow).
uint64_t TotalLength(const TransferRequest& request);

// The error of a request that missed its deadline.
absl::Status DeadlineError();

class Transport {
 public:
  virtual ~Transport() = default;
  // Short label used in metrics: "local", "tcp", ...
  virtual std::string_view name() const = 0;
  // Executes `requests[i]` into `results[i]` (same sizes); blocks until all finished or the
  // deadline (steady ms, 0 = none) passed.
  virtual void Submit(std::span<const TransferRequest* const> requests,
                      std::span<TransferResult> results, int64_t deadline_ms) = 0;
  virtual absl::Status RegisterMemory(void* /*base*/, uint64_t /*length*/,
                                      MemoryAccess /*access*/) {
    return absl::OkStatus();
  }
  virtual void UnregisterMemory(void* /*base*/) {}
};

}  // namespace mc::transfer
