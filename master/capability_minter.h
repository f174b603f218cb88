// CapabilityMinter: the master's side of capabilities (common/capability.h). It draws a random
// root key when the master starts, derives each client's owner key when it registers (handed to
// it, wrapped, in RegisterClientResponse.capability_key), and mints the capability of each
// replica a lookup, put or promotion answers, under the key of the replica's OWNER. Read grants
// expire with the lease, write grants with the writer's deadline; a replica of an owner that
// registered with no key here (unknown) gets none, and its owner refuses the frame.
// Thread-safe; minting takes a reader lock and costs ~0.2-0.3 us per replica.
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

namespace mc::master {

class CapabilityMinter {
 public:
  CapabilityMinter(auth::ClusterKeysPtr cluster_keys, const Clock& clock);

  // A client registered as `session`: its new owner key, wrapped for it under `wrap_keys` (a
  // member's keys; null: the cluster keys).
  std::string Register(const std::string& client_id, uint64_t session,
                       const auth::ClusterKeys* wrap_keys = nullptr);
  void Forget(const std::string& client_id);
  // The master's clock, as capabilities' expiries count it (sent to owners).
  int64_t NowMs() const { return clock_.NowMs(); }

  // Remembers the last owner's key across the replicas of one answer (not thread-safe: one per
  // answer being built).
  class Batch {
   public:
    explicit Batch(const CapabilityMinter& minter) : minter_(minter) {}
    // The capability bytes of `replica` (MEMORY: its range; DISK: generation, locator, length
    // and `key`'s tag) with `right` (kRead/kWrite; DISK replicas get kReadDisk) until
    // `expiry_ms`, into `out`; false (nothing granted) when its owner has no key.
    bool Mint(const Replica& replica, auth::Right right, uint64_t generation, std::string_view key,
              int64_t expiry_ms, auth::CapabilityBytes& out);

   private:
    const CapabilityMinter& minter_;
    std::string last_owner_;
    std::shared_ptr<const auth::OwnerKey> last_key_;
  };

 private:
  std::shared_ptr<const auth::OwnerKey> KeyOf(std::string_view client_id) const;

  const auth::ClusterKeysPtr cluster_keys_;
  const Clock& clock_;
  const std::string root_;  // random per master run; never leaves the process
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const auth::OwnerKey>> owners_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace mc::master
