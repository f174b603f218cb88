// The transfer engine: moves bytes between local memory and targets on mc-client daemons.
//
// Callers register local memory (only through the engine: RegisterMemory reaches every
// transport that needs it, e.g. an rdma memory region), then Submit() a batch of requests
// (transfer/transfer_request.h): each reads or writes its local buffers from or to a typed
// target on some daemon (a segment range, an SSD record, the object index) and completes with
// the number of bytes moved or an error, never OK unless exactly its total local length moved.
// A registry (transfer/transport_registry.h) builds the transports from their nested options
// (transfer/transfer_options.h) and gives each request to the first that claims it: `cuda`
// (local GPU memory), `local` (our own endpoint: memcpy through the SegmentTable), `rdma`, `tcp`
// (our framed protocol, transfer/tcp/), and any added through extra_transports
// (docs/architecture.md, "Adding a transport"). The engine hands out no transport: callers get
// capabilities (GpuTransfers, the MemoryRegistrar it is, its data-plane ops through
// EngineDataOps).
// It does not know keys, leases, recorded checksums or replicas: those belong to the batch paths
// above (on request a read also returns the XXH3 of the bytes it delivered, a GPU write the
// proof of the replica it wrote, for them to compare: Proof); the serving side is a DataServer
// (transfer/data_server.h; for tcp, transfer/tcp/server.h).
// Thread-safety: TransferEngine is thread-safe; Submit() may run concurrently from many threads.
// Local buffers must stay valid and untouched by others until Submit returns.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/metrics.h"
#include "transfer/data_server.h"
#include "transfer/gpu_transfers.h"
#include "transfer/memory_access.h"
#include "transfer/segment_table.h"
#include "transfer/transfer_options.h"
#include "transfer/transfer_request.h"

namespace mc::transfer {

class TransportRegistry;
struct TransportMetrics;

class TransferEngine final : public MemoryRegistrar {
 public:
  TransferEngine(TransferEngineOptions options, SegmentTable& local_segments);
  ~TransferEngine() override;
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // Moves every request; blocks until all finished or `deadline_ms` (steady-clock ms as
  // RealClock::NowMs(), 0 = none) passed. Returns one result per request, in order. A request
  // that could not finish by the deadline fails with kTransferFailed "deadline", and any
  // connection that still carried it is closed so no later byte of it lands. A request whose
  // local list is empty (total length 0) succeeds with 0 bytes without touching a transport.
  // INVALID_ARGUMENT, before any transport: a written SSD record, a read index notice, a proof
  // of the other direction, null local data, local lengths that overflow 64 bits.
  std::vector<TransferResult> Submit(std::span<const TransferRequest> requests,
                                     int64_t deadline_ms = 0);

  // Memory registration, the only way to the transports: every transport that needs the memory
  // registers it (rdma: a memory region; cuda: a pinned segment), the others ignore it.
  // `access`: kRemote for a segment peers may read and write (its rkey is served), kLocal for
  // memory only our own requests use (an application buffer). On an error, nothing stays
  // registered.
  absl::Status RegisterMemory(void* base, uint64_t length, MemoryAccess access) override;
  void UnregisterMemory(void* base) override;
  // Whether registering application memory (kLocal) changes how it moves: a transport here
  // moves registered memory differently (rdma: one-sided verbs; unregistered memory goes over
  // tcp). When false, registering it would only pin pages for nothing.
  bool NeedsLocalRegistration() const;

  // What the GPU transport offers besides Submit (transfer/gpu_transfers.h), or null (no
  // cuda.device, no device, built without the toolkit).
  GpuTransfers* gpu() const;

  // The data-plane ops the engine's transports may serve for peers (the rdma connection setup),
  // whatever transports this engine has: a data server registers them all (EngineDataOps).
  static std::span<const DataOp> TransportDataOps();
  // Serves one peer request of such an op: the transport that serves it, else RefuseDataOp
  // (UNAVAILABLE: e.g. no rdma here, and the peer stays on tcp).
  absl::Status ServeDataOp(const DataRequest& request, RequestStream& stream);

  // Not OK when transport "rdma" was asked for and no device could be opened.
  absl::Status status() const;

 private:
  const TransferEngineOptions options_;
  std::unique_ptr<TransportRegistry> registry_;
  std::vector<std::unique_ptr<TransportMetrics>> metrics_;  // one per registry transport
};

// Serves the engine's data-plane ops (TransferEngine::TransportDataOps) on a data server that
// starts before the engine exists: the engine needs the server's bound endpoint. RegisterWith()
// before the server starts; Attach() once the engine may answer peers (the segments it serves
// registered). Until then, and after Attach(nullptr), every such request is refused
// (RefuseDataOp). Thread-safe; must outlive the server's handlers (stop the server first), and
// an attached engine must outlive them too.
class EngineDataOps {
 public:
  absl::Status RegisterWith(DataServer& server);
  void Attach(TransferEngine* engine) { engine_.store(engine); }

 private:
  std::atomic<TransferEngine*> engine_{nullptr};
};

}  // namespace mc::transfer
