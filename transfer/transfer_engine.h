// The transfer engine: moves bytes between local memory and a segment of some mc-client.
//
// Callers register local memory (a hook for RDMA/CUDA; a no-op for host memory over local/tcp),
// then Submit() a batch of READ (remote segment -> local buffers) and WRITE (local buffers ->
// remote segment) requests; each request completes with the number of bytes moved or an error,
// and never reports OK unless exactly its total local length moved. A registry picks the
// transport per request: `local` (memcpy through this process's SegmentTable) when the endpoint
// is our own data-plane endpoint, otherwise `tcp` (our framed protocol, see transfer/tcp/).
// It does not know keys, leases, recorded checksums or replicas: those belong to the batch paths
// above (on request a read also returns the XXH3 of the bytes it delivered, for them to compare);
// the serving side is a DataServer (transfer/data_server.h; for tcp, transfer/tcp/server.h).
// Thread-safety: SegmentTable and TransferEngine are thread-safe; Submit() may run concurrently
// from many threads. Local buffers must stay valid and untouched by others until Submit returns;
// a segment must stay mapped while any transfer may touch it (Remove() does not wait).
#pragma once

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
#include "transfer/memory_access.h"
#include "transfer/transfer_options.h"

namespace mc::transfer {

// A contiguous piece of local memory (host memory: a segment, an mmap'd shm buffer, a string).
struct LocalBuffer {
  char* data;
  uint64_t length;
};

// kRead: remote segment -> local buffers; kWrite: local buffers -> remote segment;
// kReadDisk: a record of the remote daemon's SSD tier -> local buffers, read whole and verified
// by its owner (segment_id carries the generation, offset the record locator, tag the low 32
// bits of the key's XXH3). Only remote transports serve kReadDisk.
// kIndex: local buffers (an encoded index notice, transfer/index_notice.h) -> the remote
// daemon's object index, in one INDEX frame; segment_id and offset are unused. Only the tcp
// transport serves it (rdma hands it to tcp, like kReadDisk).
enum class OpKind { kRead, kWrite, kReadDisk, kIndex };

struct TransferRequest {
  OpKind op;
  std::vector<LocalBuffer> local;  // scatter/gather list; total length = bytes moved
  std::string endpoint;            // data-plane "HOST:PORT" of the daemon owning the segment
  uint64_t segment_id;
  uint64_t offset;   // byte offset inside the remote segment
  uint32_t tag = 0;  // opaque to the engine; sent in the frame's reserved field
  // The master's grant for this range (common/capability.h), sent with every frame of a remote
  // request; empty where none is needed (local transport, --auth=false) or none was granted.
  std::string capability = {};
  // kRead/kReadDisk: also compute the XXH3-64 of the local bytes as delivered, i.e. hashed from
  // the destination buffers (in order) after each piece landed there, while it is cache-hot. A
  // transport that cannot leaves TransferResult::checksum empty and the caller hashes itself.
  // kWrite from GPU memory (the cuda transport only; others ignore it): the XXH3-64 of the
  // replica as written where this daemon can hash it (its own segment), else the device hash of
  // the source after it was sent (GPUDirect RDMA); the BatchPutter compares it with the hash it
  // took before the put.
  bool want_checksum = false;
};

struct TransferResult {
  absl::Status status;
  uint64_t bytes = 0;  // bytes actually moved
  // With want_checksum: XXH3-64 of the `bytes` destination bytes, only when the status is OK.
  std::optional<uint64_t> checksum;
};

// Segments this process owns, looked up by id; shared by the local transport and the
// data-plane server. Thread-safe.
class SegmentTable {
 public:
  // Adds or replaces a segment of `size` bytes at `base` (borrowed; must outlive its entry).
  void Add(uint64_t segment_id, char* base, uint64_t size);
  void Remove(uint64_t segment_id);
  void Clear();
  // The memory range [offset, offset+length) of a segment, or an error: kNotFound for an
  // unknown segment, kInvalidArgument for a range out of bounds or overflowing.
  absl::StatusOr<char*> Resolve(uint64_t segment_id, uint64_t offset, uint64_t length) const;
  struct Entry {
    uint64_t segment_id;
    char* base;
    uint64_t size;
  };
  // Every segment (the rdma transport tells peers the rkeys of these).
  std::vector<Entry> List() const;

 private:
  struct Segment {
    char* base;
    uint64_t size;
  };
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Segment> segments_ ABSL_GUARDED_BY(mu_);
};

class TransportRegistry;
struct TransportMetrics;
namespace rdma {
class RdmaTransport;
}  // namespace rdma
namespace cuda {
class CudaTransport;
}  // namespace cuda

class TransferEngine {
 public:
  TransferEngine(TransferEngineOptions options, SegmentTable& local_segments);
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // Moves every request; blocks until all finished or `deadline_ms` (steady-clock ms as
  // RealClock::NowMs(), 0 = none) passed. Returns one result per request, in order. A request
  // that could not finish by the deadline fails with kTransferFailed "deadline", and any
  // connection that still carried it is closed so no later byte of it lands. A request whose
  // local list is empty (total length 0) succeeds with 0 bytes without touching a transport.
  std::vector<TransferResult> Submit(std::span<const TransferRequest> requests,
                                     int64_t deadline_ms = 0);

  // Hook for RDMA/CUDA memory registration; a no-op for local/tcp. `access`: kRemote for a
  // segment peers may read and write (its rkey is served), kLocal for memory only our own
  // requests use.
  absl::Status RegisterMemory(void* base, uint64_t length, MemoryAccess access);
  void UnregisterMemory(void* base);

  // The rdma transport, or null (transport "tcp", no usable device, built without ibverbs).
  // The data-plane server answers peers' rdma connection setups through it.
  rdma::RdmaTransport* rdma() const;
  // The cuda transport, or null (no cuda.device, no device, built without the toolkit). GPU
  // buffers add their device ranges to it.
  cuda::CudaTransport* cuda() const;
  // Not OK when transport "rdma" was asked for and no device could be opened.
  absl::Status status() const;

 private:
  const TransferEngineOptions options_;
  std::unique_ptr<TransportRegistry> registry_;
  std::vector<std::unique_ptr<TransportMetrics>> metrics_;  // one per registry transport
};

}  // namespace mc::transfer
