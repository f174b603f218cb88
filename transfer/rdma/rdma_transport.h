// The `rdma` transport: READ and WRITE requests as one-sided RDMA verbs between local memory
// registered with the engine (RegisterMemory: segments with remote access, application buffers
// with local access only) and the segments a peer exported (ExportSegment, or served segments
// registered with remote access), over reliable-connected queue pairs.
//
// Local memory regions and in-flight requests: every Submit holds the regions its requests'
// local buffers lie in until all its WRs ended (completed, flushed, or their QP destroyed);
// UnregisterMemory refuses the region to new requests at once (they fail, not OK), waits until
// no Submit holds it any more, and only then deregisters it, so no WR ever names a deregistered
// lkey.
//
// Connection setup is not this class's business: an RdmaConnector hands our queue pairs'
// addresses (GID, LID, QPN, PSN, MTU) to the peer and brings back the peer's, plus the address,
// length and rkey of each segment the peer exports; the peer's side of that exchange calls
// Accept(). Each peer gets `qps_per_peer` RC queue pairs, created and connected on first use.
//
// A request becomes a chain of work requests on one queue pair (so that RC's in-order
// completion covers it): each WR carries at most max_sge local pieces and at most
// `max_wr_bytes`; only the last WR of each posted chain is signalled. One completion thread per
// device polls the CQ (busy-poll `busy_poll_iterations` empty polls, then waits on the
// completion channel). A successful completion of a signalled WR completes every earlier WR of
// its queue pair; an error completion fails exactly the request whose WR it names, and the
// flushed WRs after it fail the requests they carried: a request is OK only when every one of
// its WRs completed successfully. A queue pair that reported an error is retired (destroyed once
// its WRs are drained) and replaced by a fresh one, reconnected through the connector, when the
// peer is next used.
// Deadline: outstanding requests fail with "deadline"; every queue pair that still carries one
// of them is moved to ERROR and Submit returns only after their WRs were flushed (or, past
// `flush_grace_ms`, after the queue pair was destroyed), so no byte lands after Submit returns.
// Only segment ranges are served here: SSD records and index notices stay two-sided over tcp
// (the registry never routes them here).
// Thread-safe: Submit() may run concurrently from many threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "transfer/rdma/verbs.h"
#include "transfer/remote_dma.h"
#include "transfer/segment_table.h"
#include "transfer/transport.h"

namespace mc::transfer::rdma {

// A segment a peer exports: where it is in the peer's address space and its rkey.
struct RemoteSegment {
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t rkey = 0;
};

// The peer's half of a connection setup.
struct PeerHandshake {
  std::vector<QpAddress> qps;  // one per queue pair we offered, already connected to ours
  absl::flat_hash_map<uint64_t, RemoteSegment> segments;  // by segment id
};

// Carries the connection setup to a peer (production: over the data-plane connection; tests:
// in-process). Thread-safe.
class RdmaConnector {
 public:
  virtual ~RdmaConnector() = default;
  // Offers `local` (our new queue pairs) to the peer at `endpoint`; the peer destroys its queue
  // pairs connected to the QPNs in `retired` (ours, replaced). Returns the peer's half.
  virtual absl::StatusOr<PeerHandshake> Connect(const std::string& endpoint,
                                                std::span<const QpAddress> local,
                                                std::span<const uint32_t> retired) = 0;
};

struct RdmaTransportOptions {
  int qps_per_peer = 2;                  // RC queue pairs per peer
  uint32_t send_queue_depth = 128;       // WRs per queue pair (capped by the device's max_qp_wr)
  uint64_t max_wr_bytes = 1 << 20;       // bytes one WR moves at most (<= 2 GiB)
  int busy_poll_iterations = 2000;       // empty polls before the completion thread sleeps
  int event_wait_ms = 50;                // completion-channel wait between stop checks
  int64_t flush_grace_ms = 2000;         // after a deadline: wait for flushes, then destroy the QP
  int64_t retry_unreachable_ms = 30000;  // a peer without rdma is asked again after this
  // Claims: false (transport "auto") claims requests to peers that answered the setup only, the
  // others going to tcp; true (transport "rdma") claims them whether or not (errors surface).
  bool no_fallback = false;
};

class RdmaTransport final : public Transport, public RemoteDma {
 public:
  // `connector` is borrowed and must outlive the transport.
  RdmaTransport(RdmaTransportOptions options, std::unique_ptr<VerbsDevice> device,
                RdmaConnector& connector);
  ~RdmaTransport() override;

  std::string_view name() const override { return "rdma"; }
  // Segment ranges whose local buffers lie in registered memory (others cannot be an RDMA source
  // or sink: inline payloads, application buffers past the daemon's rdma budget), to a peer that
  // is reachable (PeerReachable), or to any peer with `no_fallback`.
  bool Claims(const TransferRequest& request) override;
  void Submit(std::span<const TransferRequest* const> requests, std::span<TransferResult> results,
              int64_t deadline_ms) override;
  // Local memory that requests may use as their local buffers (a memory region each). kRemote
  // memory is also served to peers when it holds a segment of ServeSegments' table; kLocal
  // memory never is, and its region grants the device no remote access.
  absl::Status RegisterMemory(void* base, uint64_t length, MemoryAccess access) override;
  // Blocks until no Submit uses the region (see the header), then deregisters it.
  void UnregisterMemory(void* base) override;
  // Application buffers registered kLocal move as one-sided verbs; unregistered ones over tcp.
  bool NeedsLocalRegistration() const override { return true; }
  // The connection setup of peers (kRdmaConnect, handshake.h): Accept.
  bool ServesDataOp(DataOp op) const override { return op == DataOp::kRdmaConnect; }
  absl::Status ServeDataOp(const DataRequest& request, RequestStream& stream) override;
  // GPU memory for GPUDirect RDMA: [device_addr, device_addr + length), exported by CUDA as the
  // dma-buf `dmabuf_fd` (borrowed; the caller may close it once this returned), becomes a local
  // region with local access only, so that requests may name it as their local buffers (reads
  // land in it without a host copy). Never served to peers. Released with UnregisterMemory.
  // Note that this transport hashes a READ's destination on the CPU when asked
  // (Proof::kDeliveredBytes): a request into GPU memory must not ask (the cuda transport hashes
  // it on the device).
  absl::Status RegisterDeviceMemory(uint64_t device_addr, uint64_t length, int dmabuf_fd) override;

  // Serving side. Registers a segment for remote READ/WRITE; peers learn its rkey in Accept.
  absl::Status ExportSegment(uint64_t segment_id, char* base, uint64_t size);
  void UnexportSegment(uint64_t segment_id);
  // Answers a peer's Connect: creates and connects one queue pair per `remote` address,
  // destroys those connected to the peer's `retired` QPNs, and returns our half.
  absl::StatusOr<PeerHandshake> Accept(std::span<const QpAddress> remote,
                                       std::span<const uint32_t> retired);

  // Serving side: also tell peers the rkeys of the segments of `table` (borrowed, outlives us)
  // that lie inside memory registered with RegisterMemory. Call before any Accept.
  void ServeSegments(const SegmentTable* table) { served_table_ = table; }
  // True when the peer is connected, or a connection setup to it succeeds now; a peer that
  // refused (no rdma there) is not asked again for `retry_unreachable_ms`.
  bool PeerReachable(const std::string& endpoint) override;

  // True when every local buffer of `request` lies inside memory registered with us.
  bool LocalBuffersRegistered(const TransferRequest& request) const override;
  // Local memory regions registered (tests).
  size_t local_regions_for_test() const;
  const DeviceAttributes& device_attributes() const { return device_->attributes(); }
  // Queue pairs created for active connections so far (tests: re-establishment).
  uint64_t qps_created_for_test() const { return qps_created_.load(); }

 private:
  struct Batch;
  struct Qp;
  struct Peer;
  struct RequestPlan;

  void CompletionLoop();
  void HandleCompletion(const WorkCompletion& wc);
  // Pops `qp`'s posted WRs through `wr_id` (all if `wr_id` is 0 and `all`), applying `error`
  // to the one named (and to all, with `all`). Returns whether the queue is now empty.
  void Drain(Qp& qp, uint64_t wr_id, const absl::Status& error, bool all);
  absl::StatusOr<std::shared_ptr<Qp>> PickQp(const std::string& endpoint, RemoteSegment* segment,
                                             uint64_t segment_id);
  absl::Status ConnectPeer(Peer& peer, const std::string& endpoint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(peers_mu_);
  struct LocalRegion {
    MemoryRegion mr;
    MemoryAccess access = MemoryAccess::kLocal;
    uint64_t users = 0;    // Submit calls holding the region (see PinLocal)
    bool closing = false;  // UnregisterMemory waits for the users to end
  };
  // The region that holds [data, data+length), or null (closing ones too, with `any`).
  const LocalRegion* FindLocal(const char* data, uint64_t length, bool any) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mr_mu_);
  // The lkey for a local buffer; holds its region for the caller's Submit (its address is
  // appended to `held`, released by UnpinLocal once the Submit's WRs all ended).
  absl::StatusOr<uint32_t> PinLocal(const char* data, uint64_t length, std::vector<uint64_t>* held);
  void UnpinLocal(const std::vector<uint64_t>& held);
  void RetireQp(const std::shared_ptr<Qp>& qp);
  void DestroyDrained();

  const RdmaTransportOptions options_;
  const std::unique_ptr<VerbsDevice> device_;
  RdmaConnector& connector_;
  uint32_t depth_ = 0;
  const SegmentTable* served_table_ = nullptr;
  std::atomic<uint64_t> next_wr_id_{1};
  std::atomic<uint64_t> qps_created_{0};
  std::atomic<bool> stop_{false};

  mutable absl::Mutex mr_mu_;
  absl::CondVar mr_released_;                                                     // users fell
  std::map<uint64_t, LocalRegion> local_mrs_ ABSL_GUARDED_BY(mr_mu_);             // by address
  absl::flat_hash_map<uint64_t, MemoryRegion> exported_ ABSL_GUARDED_BY(mr_mu_);  // by segment

  absl::Mutex peers_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(peers_mu_);
  // Peers whose connection setup failed, and when.
  absl::flat_hash_map<std::string, int64_t> unreachable_ ABSL_GUARDED_BY(peers_mu_);

  absl::Mutex qps_mu_;  // never held while a Qp::mu or a Batch::mu is taken
  absl::flat_hash_map<uint32_t, std::shared_ptr<Qp>> by_qpn_ ABSL_GUARDED_BY(qps_mu_);
  std::vector<std::shared_ptr<Qp>> retiring_ ABSL_GUARDED_BY(qps_mu_);
  absl::flat_hash_map<uint32_t, QueuePair> accepted_ ABSL_GUARDED_BY(qps_mu_);  // by remote QPN

  std::thread completion_thread_;
};

}  // namespace mc::transfer::rdma
