// BatchGetter: the get path, where peers lost bytes. Invariants (DESIGN.md 1-3, 6):
//  - keys are deduplicated for the master lookup and the transfer, never for the accounting of
//    destinations: every requested item gets its own result, in request order;
//  - one GetReplicas RPC for the unique keys not pinned by a MatchPrefix lease;
//  - a replica is chosen per key (own segment, remote memory, own SSD tier, a remote SSD tier);
//    a failed transfer or a checksum mismatch falls back to the next replica before the key
//    fails; SSD reads run under the same lease and checksum rules as memory reads;
//  - each unique key is transferred once, into its first valid destination, then copied into
//    every other destination of that key;
//  - GPU memory (GetRequestItem::gpu) is never read or written by the CPU. A key whose only
//    destination is one GPU slice, with a replica in this daemon's memory or a remote memory
//    replica the NIC can read into that slice (GPUDirect RDMA), is read into it by the cuda
//    transport from such replicas (the others through staging, should those fail). Otherwise the
//    key is read into pinned staging memory (GpuGetStager) under the usual checks and copied from
//    there into each of its destinations, GPU slices by the device. Either way a GPU slice is OK
//    only with a device hash of the bytes that landed: equal to the recorded checksum (a whole
//    object), or to the hash of its range of the verified staging bytes (a scattered destination)
//    (docs/gpu.md);
//  - an item is OK only when its own destination received exactly `size` bytes from this get and
//    their XXH3 equals the checksum recorded at put; a transfer that finished after its lease
//    expired is LEASE_EXPIRED; destinations that overlap each other are rejected up front;
//  - the release of the leases this call took is sent before it returns, without waiting for the
//    reply (MasterClient::ReleaseLeasesAsync: this client's later puts and removes wait for it);
//  - self-repair (DESIGN.md invariant 10): a MEMORY replica that failed the checksum is read
//    once more into private memory (the application may have changed its own destination under
//    the read); if that copy fails too, the replica is reported CORRUPT to the master, which
//    drops it (and the key with its last replica, so it can be stored again). A holder that
//    refused the connection is reported UNREACHABLE and skipped by every get for the back-off
//    period (HolderBackoff): the key's other replicas are read at once, the holder is not dialled
//    again per block. Reports go out before the leases are released (the master accepts a
//    CORRUPT report only from a reader that holds a lease).
//  - speculative local copies (SetSpeculation; docs/architecture.md): a key this daemon's own
//    ObjectIndex places in its segments may be copied into its one host destination while the
//    lookup is in flight; the copy is kept only when the answer names that very replica (segment,
//    offset, size), the same generation, with a lease, and the bytes as written hash to the
//    answer's checksum. Otherwise the key is read from the answer as above.
// Thread-safe: concurrent Get() calls share nothing but thread-safe collaborators.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/batch/batch_types.h"
#include "client/batch/gpu_get_stager.h"
#include "client/batch/holder_backoff.h"
#include "client/batch/prefix_leases.h"
#include "client/batch/promoter.h"
#include "client/batch/speculative_copier.h"
#include "client/client_metrics.h"
#include "client/session/master_client.h"
#include "client/session/object_index.h"
#include "client/session/packed_keys_gate.h"
#include "client/tier/disk_reader.h"
#include "common/clock.h"
#include "transfer/transfer_engine.h"

namespace mc::client {

struct BatchGetOptions {
  std::string client_id;
  std::string local_endpoint;  // replicas here are read first (local memcpy)
  uint32_t lease_ttl_ms = 0;   // 0 = the master's default
  int max_replica_rounds = 8;  // fallback rounds before a key fails
  // Self-repair: checksum mismatches re-read into private memory per call, and their bytes.
  size_t max_confirm_reads = 16;
  uint64_t max_confirm_bytes = 256ull << 20;
  // The lookup names its keys packed (GetReplicasRequest.packed_keys) and asks for the answer as
  // columns (`packed`): one string each way instead of one per key (--pack_master_keys). A
  // master older than packed keys answers keys_seen 0 (it saw no keys, so leased nothing): the
  // lookup is sent again key by key, and packing rests for packed_keys_retry_ms, for this
  // daemon's MatchPrefix too (packed_keys()).
  bool pack_master_keys = true;
  int64_t packed_keys_retry_ms = 60'000;
};

// Where speculative local copies come from (BatchGetter::SetSpeculation).
struct SpeculationSource {
  const ObjectIndex* index = nullptr;  // this daemon's own index (borrowed)
  std::vector<LocalBuffer> segments;   // base and size of each local segment, by local index
  // A segment id this daemon publishes now -> its local index (SegmentPool::LocalIndexOf).
  std::function<std::optional<size_t>(uint64_t segment_id)> resolve;
  // A get whose keys held here total more bytes does not speculate: larger gets keep the
  // transfer engine's parallel copies (copy_threads helpers and the caller; speculation copies
  // with two threads, the helper and, once the answer is in, the get's own).
  uint64_t max_job_bytes = 16ull << 20;
  size_t max_job_keys = 64;  // nor does a get asking the master for more keys
};

class BatchGetter {
 public:
  BatchGetter(BatchGetOptions options, MasterClient& master, transfer::TransferEngine& engine,
              PrefixLeases& prefix_leases, const Clock& clock, ClientMetrics& metrics);

  // One result per item, in order. `lease_id` (from MatchPrefix) may be 0. `sink` provides memory
  // for inline items and may be null when there are none.
  std::vector<GetItemResult> Get(std::vector<GetRequestItem>& items, uint64_t lease_id,
                                 InlineSink* sink);
  // Lets the getter read DISK replicas of this daemon's own SSD tier (null: none). Set before use.
  void SetDiskReader(DiskReader* reader) { disk_reader_ = reader; }
  // Writes SSD hits back to memory after they were verified (null: never). Set before use.
  void SetPromoter(Promoter* promoter) { promoter_ = promoter; }
  // Stages GPU destinations that the cuda transport cannot fill directly (null: they fail
  // INVALID_ARGUMENT). Set before use.
  void SetGpuStager(GpuGetStager* stager) { gpu_stager_ = stager; }
  // Skips and records holders that refused connections (null: every replica is always tried).
  // Set before use.
  void SetHolderBackoff(HolderBackoff* backoff) { backoff_ = backoff; }
  // Turns on speculative local copies (and starts their helper thread). Set before use.
  void SetSpeculation(SpeculationSource source);
  // Whether lookups (this getter's, and the Store service's MatchPrefix) name their keys packed
  // now: resting after an older master was met.
  PackedKeysGate& packed_keys() { return packed_keys_; }
  // Whether speculative copies are being made now (tests).
  bool SpeculationBusy() const { return copier_ != nullptr && copier_->busy(); }
  void PauseSpeculationForTest(bool paused) {
    if (copier_ != nullptr) copier_->PauseForTest(paused);
  }

 private:
  struct KeyPlan;
  struct Batch;
  void Lookup(Batch& batch, uint64_t lease_id);
  // From each plan's lookup: its status, and the order in which its replicas are read.
  void OrderReplicas(Batch& batch);
  // Speculative local copies (client/batch/batch_get_speculate.cc): started for the plans
  // `asked` of the master before the lookup, settled once destinations are assigned (kept ones
  // mark their plan done; the others are read in TransferRounds).
  struct Speculated;
  void StartSpeculation(Batch& batch, const std::vector<size_t>& asked);
  void SettleSpeculation(Batch& batch);
  bool SpeculationMatches(const Batch& batch, const Speculated& s) const;
  void AssignDestinations(Batch& batch, InlineSink* sink);
  // GPU destinations (GetRequestItem::gpu) of `plan`: a key whose only destination is GPU
  // memory and that has a replica in this daemon's memory is read straight into it (cuda
  // transport; should its local replicas fail, the others are read through staging); any other
  // key with a GPU destination reserves staging memory from the GpuGetStager, and without it
  // its GPU destinations fail alone.
  void PlanGpuDestinations(Batch& batch, KeyPlan& plan) const;
  // Reserves `plan`'s staging memory (the object's size), or the reason it cannot.
  absl::Status ReserveStaging(KeyPlan& plan) const;
  bool IsLocalMemory(const KeyPlan& plan, int replica) const;
  // Whether `replica` can be read straight into `plan`'s one GPU destination: a local memory
  // replica (cuda transport), or a remote one over GPUDirect RDMA (GpuTransfers::CanReadDirect).
  bool IsDirectSource(const Batch& batch, const KeyPlan& plan, int replica) const;
  static const std::vector<LocalBuffer>& ReadInto(const Batch& batch, const KeyPlan& plan);
  // Reads each key from its replicas in rounds (client/batch/batch_get_reads.cc): a round reads
  // every unfinished key from its next replica; a failed or unverified read falls back to the
  // next replica in the following round.
  void TransferRounds(Batch& batch);
  // The read of `plan`'s next replica this round, or none (done, failed, or out of replicas;
  // plan.status then says why).
  std::optional<transfer::TransferRequest> NextRead(Batch& batch, KeyPlan& plan);
  // Judges the read of plan `p` from `endpoint`: done when its bytes are whole and verified,
  // else plan.status set (cleared again while another replica remains to try).
  void SettleRead(Batch& batch, size_t p, const std::string& endpoint,
                  const transfer::TransferResult& res, int64_t now);
  // Runs one round of reads: engine transfers, and our own SSD records through the DiskReader.
  std::vector<transfer::TransferResult> SubmitReads(const Batch& batch,
                                                    std::vector<transfer::TransferRequest>& reqs,
                                                    const std::vector<size_t>& owner,
                                                    int64_t deadline_ms);
  void FanOut(Batch& batch);
  // Fills item `item` (destination `dest`, with GPU slices) of staged key `plan` from its
  // staging memory: host slices copied and compared here, GPU slices appended to `gpu_copies`
  // with the hash their bytes must have (the object's checksum for a lone GPU slice, else the
  // XXH3-64 of their range of the verified staging bytes). `*bytes_written`: host bytes.
  absl::Status StageOut(const KeyPlan& plan, const GetRequestItem& item,
                        const std::vector<LocalBuffer>& dest, uint64_t* bytes_written,
                        std::vector<GpuGetStager::Copy>* gpu_copies) const;
  void ReleaseLeases(Batch& batch);
  // Whether replica `r` of `plan` is on a holder that refused connections moments ago.
  bool HolderBackingOff(const KeyPlan& plan, int r) const;
  // Records a failed read of replica `r` of `plan` (unreachable holder, checksum mismatch) for
  // RepairReplicas.
  void NoteFault(Batch& batch, size_t plan, int r, const absl::Status& status, bool mismatch);
  // Confirms the checksum mismatches on private copies and reports the bad replicas and the
  // unreachable holders to the master (one RPC, only when there is something to report).
  void RepairReplicas(Batch& batch);
  // Hands the keys served from an SSD tier to the promoter (while their leases still hold).
  void PromoteDiskHits(Batch& batch);

  const BatchGetOptions options_;
  MasterClient& master_;
  transfer::TransferEngine& engine_;
  PrefixLeases& prefix_leases_;
  const Clock& clock_;
  ClientMetrics& metrics_;
  DiskReader* disk_reader_ = nullptr;
  Promoter* promoter_ = nullptr;
  GpuGetStager* gpu_stager_ = nullptr;
  HolderBackoff* backoff_ = nullptr;
  std::optional<SpeculationSource> speculation_;
  std::unique_ptr<SpeculativeCopier> copier_;
  PackedKeysGate packed_keys_;
};

// Copies `from` (scattered) into `to` (scattered); returns bytes copied (min of both totals).
uint64_t ScatterCopy(const std::vector<LocalBuffer>& from, const std::vector<LocalBuffer>& to);
// ScatterCopy fused with XXH3-64 of the destination bytes as written (chunk by chunk, in order);
// sets *copied to the bytes copied.
uint64_t ScatterCopyChecksum(const std::vector<LocalBuffer>& from,
                             const std::vector<LocalBuffer>& to, uint64_t* copied);
// XXH3-64 over scattered pieces.
uint64_t ScatterChecksum(const std::vector<LocalBuffer>& pieces);
// Marks every item whose slices overlap another's (or its own) with INVALID_ARGUMENT.
void RejectOverlappingDestinations(std::vector<GetRequestItem>& items);

}  // namespace mc::client
