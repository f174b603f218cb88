// BatchPutter: the put path. For a batch: one PutStart RPC, every replica written through the
// transfer engine in one submission, one PutEnd RPC for the items whose replicas were all written
// and one PutRevoke RPC for the rest. One status per item, in order; ALREADY_EXISTS and every
// other failure stay with their own item.
// The checksum recorded (XXH3-64 of the payload) is taken from the bytes, once: the write of a
// replica in this daemon's own segments asks for the proof of what it stored
// (transfer::Proof::kWrittenReplica), and the local transport hashes each chunk from the segment
// right after copying it, so an item whose replicas are all local is read once and its checksum
// is that of the stored bytes. The local writes are submitted before the remote ones. An item
// with a local and remote replicas is then hashed from its source after its remote writes, and
// that hash must equal its local replica's: a buffer the application changed during the put
// fails the item CHECKSUM_MISMATCH (`mc_client_checksum_mismatches_total`) and it is revoked,
// never recorded with a checksum one of its replicas does not have. An item whose replicas are
// all remote is hashed from its source before they are sent, as no transport proves a write
// from host memory to a peer (`mc_client_put_source_hashes_total` counts the items hashed apart
// from a copy). An item whose checksum is given (PutRequestItem::checksum: GPU sources) keeps it.
// Writes stop at the master's write deadline (half its put timeout, measured from before
// PutStart was sent), so a put the master revokes by timeout is never still being written.
// Items the master answers NO_SPACE (memory full of objects it may not evict yet: leased by reads
// in progress, or still being written) are tried again, alone, after the rest of the batch has
// ended, with a growing pause, for up to `no_space_wait_ms`; only then is NO_SPACE answered. A
// NO_SPACE the master marks final (no segment can ever hold the object) is answered at once. One
// it marks write_back_pending (memory full of objects whose write-back to an SSD tier has not
// ended: invariant 7 keeps them in memory until then) is retried for up to `write_back_wait_ms`:
// when puts outrun the disk they wait for it, then answer NO_SPACE, never OK and lose data.
// With an IndexNotifier, the owners of an item's replicas learn what they hold (key,
// generation, size, checksum; client/session/index_service.h) after all its replicas were written
// and before its PutEnd; a failed notice is counted and the put goes on. Direct GPU puts
// (PutRequestItem::gpu_direct, with a GpuPutStager): each replica the cuda transport can write is
// written straight from GPU memory and must come back with a checksum equal to the item's (the
// device hash of the source taken before the put); an item with any other replica is staged through
// the stager first and written from the host copy. An item whose replica holder refused the
// connection (its daemon is gone; the master may not know yet) is placed once more, avoiding
// that holder (PutStartRequest.avoid_clients), and the holder is reported to the master
// (ReportReplicaFaults UNREACHABLE) and skipped by the batch paths for a while (HolderBackoff).
// Thread-safe.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "client/batch/batch_types.h"
#include "client/batch/gpu_put_stager.h"
#include "client/batch/holder_backoff.h"
#include "client/client_metrics.h"
#include "client/session/index_service.h"
#include "client/session/master_client.h"
#include "common/clock.h"
#include "transfer/transfer_engine.h"

namespace mc::client {

struct BatchPutOptions {
  std::string client_id;
  uint32_t max_replicas = 8;
  // How long a NO_SPACE item is retried before NO_SPACE is answered; 0 = answer at once.
  int64_t no_space_wait_ms = 100;
  // Longest wait for the replicas' writes (the master's write deadline caps it too); an item
  // whose replicas are not all written by then fails TRANSFER_FAILED and is revoked.
  int64_t write_timeout_ms = 10'000;
  // How long an item that waits for write-back to SSD is retried (see above).
  int64_t write_back_wait_ms = 10'000;
};

class BatchPutter {
 public:
  BatchPutter(BatchPutOptions options, MasterClient& master, transfer::TransferEngine& engine,
              const Clock& clock, ClientMetrics& metrics);

  std::vector<absl::Status> Put(const std::vector<PutRequestItem>& items, uint32_t replicas);
  // Owners' index notices (borrowed; null = none, the default). Before the first Put.
  void SetIndexNotifier(IndexNotifier* notifier) { notifier_ = notifier; }
  // Writes direct GPU items (borrowed; null = none, the default: such items fail). Before the
  // first Put.
  void SetGpuStager(GpuPutStager* stager) { gpu_ = stager; }
  // Records and skips holders that refused connections (borrowed; null = none). Before the
  // first Put.
  void SetHolderBackoff(HolderBackoff* backoff) { backoff_ = backoff; }

 private:
  // What a NO_SPACE answer lets the item do: retry briefly, not at all, or wait for write-back.
  enum class NoSpaceKind { kTransient, kFinal, kWriteBack };
  // One PutStart / write / PutEnd (or PutRevoke) round for items[i], i in `started`
  // (validated); sets out[i], and kind[i] for a NO_SPACE answer.
  // `avoid`: holders not to place on; the holders that refused a write are added to it (and
  // their items' out[i] carry the peer-unreachable mark, common/status.h).
  void PutOnce(const std::vector<PutRequestItem>& items, const std::vector<size_t>& started,
               uint32_t replicas, std::vector<absl::Status>& out, std::vector<NoSpaceKind>& kind,
               std::vector<std::string>& avoid);
  // PutOnce's steps. PlanWrites: the writes of every replica placed (out[i] and kind[i] set for
  // the items the master refused). CheckWrites: write_status[k] of each item whose write failed
  // or came back without the proof it owed (GPU sources); holders that refused a write join
  // `avoid`. SettleChecksums: checksums[k] of each item written (its local replica's proof, the
  // source's hash where it has remote replicas); write_status[k] CHECKSUM_MISMATCH where the
  // source no longer hashes to what its local replica stored.
  // EndOrRevoke: PutEnd for the items written, PutRevoke for the others (out[i] set for both).
  // checksums, write_status: one per entry of `started`.
  struct ReplicaWrites;
  void PlanWrites(const std::vector<PutRequestItem>& items, const std::vector<size_t>& started,
                  const v1::PutStartResponse& placed, std::vector<absl::Status>& out,
                  std::vector<NoSpaceKind>& kind, std::vector<absl::Status>& write_status,
                  ReplicaWrites& plan);
  void CheckWrites(const std::vector<PutRequestItem>& items, const ReplicaWrites& plan,
                   const std::vector<transfer::TransferResult>& written,
                   const std::vector<size_t>& started, std::vector<absl::Status>& write_status,
                   std::vector<std::string>& avoid);
  void SettleChecksums(const std::vector<PutRequestItem>& items, const std::vector<size_t>& started,
                       const ReplicaWrites& plan,
                       const std::vector<transfer::TransferResult>& written,
                       std::vector<uint64_t>& checksums, std::vector<absl::Status>& write_status);
  void EndOrRevoke(const std::vector<PutRequestItem>& items, const std::vector<size_t>& started,
                   const v1::PutStartResponse& placed, const std::vector<uint64_t>& checksums,
                   const std::vector<absl::Status>& write_status, std::vector<absl::Status>& out);
  void EndPuts(const std::vector<PutRequestItem>& items, const v1::PutEndRequest& end,
               const std::vector<size_t>& ended, std::vector<absl::Status>& out);
  // Tells the master about holders that refused our connections.
  void ReportUnreachable(const std::vector<std::string>& holders);

  // What a direct GPU item's replicas are written from: its own pieces (GPU memory) when the
  // cuda transport can write every replica placed, else a proved host copy kept in `staged`.
  absl::StatusOr<const std::vector<LocalBuffer>*> DirectSource(
      const PutRequestItem& item, const v1::PutStartResult& placed, uint64_t checksum,
      std::deque<GpuPutStager::HostCopy>& staged);

  // Tells the owners of the written replicas of items[started[k]] (write_status[k] OK) what they
  // hold. An item none of whose owners recorded it while some owner keeping an index failed to
  // gets write_status[k] TRANSFER_FAILED: it would be readable now but forgotten by a master
  // restart, so it is revoked rather than acknowledged.
  void NotifyOwners(const std::vector<PutRequestItem>& items, const std::vector<size_t>& started,
                    const v1::PutStartResponse& placed, const std::vector<uint64_t>& checksums,
                    int64_t deadline_ms, std::vector<absl::Status>& write_status);

  const BatchPutOptions options_;
  MasterClient& master_;
  transfer::TransferEngine& engine_;
  const Clock& clock_;
  ClientMetrics& metrics_;
  IndexNotifier* notifier_ = nullptr;
  GpuPutStager* gpu_ = nullptr;
  HolderBackoff* backoff_ = nullptr;
};

}  // namespace mc::client
