// CapabilityMinter: the master's side of capabilities (common/capability.h). It draws a random
// root key when the master starts, derives each client's owner key when it registers (handed to
// it, wrapped, in RegisterClientResponse.capability_key), and mints the capability of each
// replica a lookup, put or promotion answers, under the key of the replica's OWNER (a lookup's
// own replicas excepted: see Batch). Read grants expire with the lease, write grants with the
// writer's deadline; a replica of an owner that registered with no key here (unknown) gets none,
// and its owner refuses the frame.
// Thread-safe. The owner keys are an immutable snapshot replaced whole at each registration and
// forget (registrations are rare, lookups are not): an answer takes the snapshot once, then
// minting costs one MAC (~0.2 us) per replica and one hash lookup per owner met (a replica as the
// table stores it finds its owner's key by PeerNames index after the first), with no lock and no
// reference count touched per replica. A Forget reaches the answers begun after it; one begun
// before it may still mint under the forgotten key (as before with its per-answer cache), which
// grants nothing the owner's next session accepts (its key is derived anew). A registration copies
// the map (O(registered clients): ~50 us at 1,000 clients).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/capability.h"
#include "common/clock.h"
#include "master/object.h"
#include "master/peer_slots.h"

namespace mc::master {

class CapabilityMinter {
 public:
  // Owner keys by client id (one snapshot; see the class comment).
  using OwnerMap = absl::flat_hash_map<std::string, std::shared_ptr<const auth::OwnerKey>>;

  CapabilityMinter(auth::ClusterKeysPtr cluster_keys, const Clock& clock);

  // A client registered as `session`: its new owner key, wrapped for it under `wrap_keys` (a
  // member's keys; null: the cluster keys).
  std::string Register(const std::string& client_id, uint64_t session,
                       const auth::ClusterKeys* wrap_keys = nullptr);
  void Forget(const std::string& client_id);
  // The master's clock, as capabilities' expiries count it (sent to owners).
  int64_t NowMs() const { return clock_.NowMs(); }

  // The owner keys as one answer sees them (not thread-safe: one per answer being built).
  // `self`: the client the answer is for (a lookup's asker); a replica it holds itself is
  // granted nothing, since it reads its own memory and SSD records directly, never through
  // its data plane (empty: every replica with a key is granted).
  class Batch {
   public:
    explicit Batch(const CapabilityMinter& minter, std::string_view self = {})
        : owners_(minter.Owners()), self_(self) {}
    // The capability bytes of `replica` (MEMORY: its range; DISK: generation, locator, length
    // and `key`'s tag) with `right` (kRead/kWrite; DISK replicas get kReadDisk) until
    // `expiry_ms`, into `out`; false (nothing granted) when its owner has no key.
    bool Mint(const Replica& replica, auth::Right right, uint64_t generation, std::string_view key,
              int64_t expiry_ms, auth::CapabilityBytes& out);
    // The same for a replica as the table stores it (a lookup's answer: no strings copied).
    // Its owner's key is found once per holder (by PeerNames index), not per replica.
    bool Mint(const StoredReplica& replica, auth::Right right, uint64_t generation,
              std::string_view key, int64_t expiry_ms, auth::CapabilityBytes& out) {
      auto [owner_key, first] = peer_keys_.Slot(replica.peer);
      if (first) *owner_key = IsSelf(replica.client_id()) ? nullptr : Find(replica.client_id());
      if (*owner_key == nullptr) return false;
      MintUnder(**owner_key, {replica.tier, replica.segment_id, replica.offset, replica.length},
                right, generation, key, expiry_ms, out);
      return true;
    }

   private:
    // What a capability names of its replica.
    struct Target {
      ReplicaTier tier;
      uint64_t segment_id;
      uint64_t offset;
      uint64_t length;
    };
    // `client_id`'s key in the snapshot (null: none).
    const auth::OwnerKey* Find(std::string_view client_id) const;
    bool IsSelf(std::string_view client_id) const { return !self_.empty() && client_id == self_; }
    static void MintUnder(const auth::OwnerKey& owner_key, const Target& replica, auth::Right right,
                          uint64_t generation, std::string_view key, int64_t expiry_ms,
                          auth::CapabilityBytes& out);

    std::shared_ptr<const OwnerMap> owners_;      // keeps the snapshot's keys alive
    std::string_view self_;                       // the answer's asker (see the constructor)
    std::string last_owner_;                      // a Replica's owner, minted for last
    const auth::OwnerKey* last_key_ = nullptr;    // last_owner_'s, from owners_ (null: none)
    PeerSlots<const auth::OwnerKey*> peer_keys_;  // each holder's key (null: none), from owners_
  };

 private:
  // The current snapshot (never null).
  std::shared_ptr<const OwnerMap> Owners() const;

  const auth::ClusterKeysPtr cluster_keys_;
  const Clock& clock_;
  const std::string root_;  // random per master run; never leaves the process
  mutable absl::Mutex mu_;
  // Copied on write: a snapshot handed out is never changed.
  std::shared_ptr<const OwnerMap> owners_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mc::master
