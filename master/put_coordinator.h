// PutCoordinator: the put lifecycle and promotion, the writes into memory.
//   PutStart reserves each key as a PENDING object with a new generation and places its
//   replicas (evicting synchronously between tries); PutEnd completes it, PutRevoke drops it, and
//   RunMaintenance revokes the puts not ended within put_timeout_ms. PromoteStart/PromoteEnd do
//   the same for a memory copy of an object that lives only on an SSD tier.
// It owns the pending puts (the deadlines of puts and promotions in progress, one key function:
// PendingKeyOf) and the generation counter; every other service that drops a pending object or
// a promotion does it through ForgetPending / DropPromotion, so no deadline is left behind.
// Every batched call answers one result per input item, in order; bad input is a per-key error
// and changes nothing. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "master/disputed_keys.h"
#include "master/generation_counter.h"
#include "master/master_tables.h"
#include "master/pending_puts.h"

namespace mc::master {

class PutCoordinator {
 public:
  // `kick_planner`: asks for an offload planning pass now (puts that wait for write-backs).
  // `disputed`: keys whose reports conflicted; a put that ends vouches for its key again.
  PutCoordinator(MasterTables& tables, DisputedKeys& disputed, std::function<void()> kick_planner);

  // `avoid`: clients not to place on (holders that refused the writer moments ago).
  std::vector<PutStartOutcome> PutStart(const std::string& client_id,
                                        const std::vector<PutStartItem>& items, uint32_t replicas,
                                        const std::vector<std::string>& avoid = {});
  std::vector<absl::Status> PutEnd(const std::string& client_id,
                                   const std::vector<PutEndItem>& items);
  std::vector<absl::Status> PutRevoke(const std::string& client_id,
                                      const std::vector<PutRevokeItem>& items);
  // Promotion of SSD hits back to memory (see master.proto PromoteStart/PromoteEnd).
  std::vector<PutStartOutcome> PromoteStart(const std::string& client_id,
                                            const std::vector<PromoteItem>& items);
  std::vector<absl::Status> PromoteEnd(const std::string& client_id,
                                       const std::vector<PromoteItem>& items,
                                       const std::vector<bool>& written);

  // Maintenance: revokes the puts and promotions older than put_timeout_ms.
  void RevokeTimedOutPuts();

  // Ends an object's promotion, if any, queueing its space in `to_free`.
  void DropPromotion(ObjectTable::Shard& shard, const Object& object,
                     std::vector<MemoryLocation>* to_free) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  // Forgets the deadline of a PENDING object's put (the object is being erased).
  void ForgetPending(const Object& object);

  GenerationCounter& generations() { return generations_; }
  const GenerationCounter& generations() const { return generations_; }

 private:
  // The key of a put or promotion started at `start_ms` in pending_: its deadline, then its
  // generation.
  PendingPuts::Key PendingKeyOf(int64_t start_ms, uint64_t generation) const {
    return {start_ms + options_.put_timeout_ms, generation};
  }
  // PutStart's steps: check the items, reserve the keys, place the replicas, attach them.
  void CheckPutItems(const std::string& client_id, bool known_client,
                     const std::vector<PutStartItem>& items, uint32_t replicas,
                     std::vector<PutStartOutcome>* out) const;
  void ReservePuts(const std::string& client_id, const std::vector<PutStartItem>& items,
                   const std::vector<std::string_view>& keys, uint32_t replicas, int64_t now,
                   std::vector<PutStartOutcome>* out);
  std::vector<std::vector<MemoryLocation>> PlacePuts(const std::string& client_id,
                                                     const std::vector<PutStartItem>& items,
                                                     uint32_t replicas,
                                                     const std::vector<std::string>& avoid,
                                                     std::vector<PutStartOutcome>* out);
  void AttachPuts(const std::vector<PutStartItem>& items, const std::vector<std::string_view>& keys,
                  int64_t now, std::vector<std::vector<MemoryLocation>>& placed,
                  std::vector<PutStartOutcome>* out);
  // Revokes the PENDING put `it`: its deadline forgotten, its memory replicas queued in
  // `to_free`, the object erased.
  void RevokePut(ObjectTable::Shard& shard, ObjectMap::iterator it,
                 std::vector<MemoryLocation>* to_free) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  // Places one object's replicas, evicting synchronously between tries.
  // `persisted_only`: evict only objects that also live on an SSD tier (promotions).
  // `final` (optional) is set when the NO_SPACE answer is one no eviction can cure;
  // `write_back_pending` (optional) when it waits for offloads to end (invariant 7).
  absl::StatusOr<std::vector<MemoryLocation>> PlaceWithEviction(
      uint64_t size, uint32_t replicas, const std::string& writer, bool persisted_only = false,
      bool* final = nullptr, bool* write_back_pending = nullptr,
      const std::vector<std::string>& avoid = {});

  const MasterOptions& options_;
  const Clock& clock_;
  ObjectTable& table_;
  SegmentManager& segments_;
  ClientRegistry& clients_;
  Evictor& evictor_;
  DisputedKeys& disputed_;
  const std::function<void()> kick_planner_;
  PendingPuts pending_;
  GenerationCounter generations_;
  Counter& puts_timed_out_;
  Counter& no_space_;
  Counter& write_back_waits_;
};

}  // namespace mc::master
