// One way of moving bytes (local memcpy, tcp, rdma, cuda), behind the TransferEngine.
//
// The engine validates requests (non-empty, no length overflow, a target and proof of the
// request's direction), groups them per transport and hands each transport its share of the
// batch. A transport fills one result per request it was given; it must never report OK unless
// exactly the request's total local length moved, and must honour the deadline (kTransferFailed
// "deadline"). Implementations are thread-safe: Submit() may run concurrently from many threads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/metrics.h"
#include "transfer/data_server.h"
#include "transfer/memory_access.h"
#include "transfer/segment_table.h"
#include "transfer/transfer_request.h"

namespace mc::transfer {

// Sum of the local buffer lengths of `request` (the engine has checked it does not overflow).
uint64_t TotalLength(const TransferRequest& request);

// The error of a request that missed its deadline.
absl::Status DeadlineError();

class Transport;

// What the engine hands a transport it builds (TransferEngineOptions::extra_transports).
struct TransportContext {
  const std::string& local_endpoint;  // this daemon's data-plane endpoint
  SegmentTable& segments;             // this daemon's own segments (outlive the transport)
  MetricsRegistry* metrics;           // null: no metrics
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Short label used in metrics: "local", "tcp", ...
  virtual std::string_view name() const = 0;
  // Whether this transport takes `request` (a valid, non-empty one). The registry asks the
  // transports in its routing order and gives the request to the first that claims it; `tcp`,
  // last, claims every request. May block briefly (rdma: a connection setup to a new peer).
  virtual bool Claims(const TransferRequest& request) = 0;
  // Executes `requests[i]` into `results[i]` (same sizes); blocks until all finished or the
  // deadline (steady ms, 0 = none) passed.
  virtual void Submit(std::span<const TransferRequest* const> requests,
                      std::span<TransferResult> results, int64_t deadline_ms) = 0;

  // Memory registration, reached only through the engine (TransferEngine::RegisterMemory),
  // which calls every transport: each does what it needs (an rdma memory region, a pinned
  // segment) and ignores the rest.
  virtual absl::Status RegisterMemory(void* /*base*/, uint64_t /*length*/,
                                      MemoryAccess /*access*/) {
    return absl::OkStatus();
  }
  // Blocks until no request of this transport uses the memory, then releases it.
  virtual void UnregisterMemory(void* /*base*/) {}
  // Whether registering application memory (MemoryAccess::kLocal) changes how this transport
  // moves it (rdma: one-sided verbs need a memory region); see
  // TransferEngine::NeedsLocalRegistration.
  virtual bool NeedsLocalRegistration() const { return false; }

  // The data-plane ops this transport serves on its daemon's data server (rdma: its connection
  // setup, DataOp::kRdmaConnect), routed by TransferEngine::ServeDataOp. The handler contract of
  // transfer/data_server.h applies.
  virtual bool ServesDataOp(DataOp /*op*/) const { return false; }
  virtual absl::Status ServeDataOp(const DataRequest& request, RequestStream& stream) {
    return RefuseDataOp(request, stream);
  }
};

}  // namespace mc::transfer
