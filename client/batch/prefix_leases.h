// PrefixLeases: leases handed to applications by MatchPrefix, with the replicas they pin.
//
// A lease pins exactly the matched keys (the master holds the read lease); BatchGet with its id
// reads those keys from the pinned replicas without asking the master again, until the lease is
// released or its local deadline passes (computed from before the master granted it, so it never
// outlives the master's). A lease belongs to the caller that took it (`owner`) and carries a
// capability (`token`, 16 random bytes, handed out with its id by MatchPrefix): whoever presents
// the token may read under the lease and release it (another process of the same engine), as
// the owner may; anyone else's use of the id is no lease. Thread-safe.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <google/protobuf/arena.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "mcstore/v1/master.pb.h"
#include "proto/packed_lookups.h"

namespace mc::client {

struct PrefixLease {
  uint64_t master_lease_id = 0;
  std::string owner;        // the caller that holds it (client/access/store_auth.h); "" in-process
  std::string token;        // its capability (PrefixLeases::kTokenBytes random bytes); "" = none
  int64_t deadline_ms = 0;  // local steady clock
  // The master's answer (PackedLookups, one row per matched key) and the keys live on this arena:
  // MatchPrefix parses the answer straight onto it, and the keys the lease indexes point into it.
  std::unique_ptr<google::protobuf::Arena> arena = std::make_unique<google::protobuf::Arena>();
  PackedLookupsReader lookups;

  // Names the rows' keys: `by_row[i]` is row i's key, a view that lives as long as the lease
  // (on its arena). A key named twice keeps its first row.
  void IndexRows(const std::vector<std::string_view>& by_row);
  // Pins `key` with a copy of `lookup` (a new row; O(rows) per call: for tests and small leases).
  void Pin(std::string_view key, const mcstore::v1::KeyReplicas& lookup);
  // The keys by row: the order they matched, which is the order the master granted their leases
  // (a release in that order is matched against its grant records, master/shard_leases.h). A
  // key named twice in the match appears once, at its first row.
  const std::vector<std::string_view>& KeysInMatchOrder() const { return match_order_; }
  // `key`'s row, if the lease pins it.
  std::optional<uint32_t> RowOf(std::string_view key) const {
    auto it = rows_.find(key);
    if (it == rows_.end()) return std::nullopt;
    return it->second;
  }

 private:
  // Adds `key` at `row` unless it has a row already.
  void IndexRow(std::string_view key, uint32_t row);

  mcstore::v1::PackedLookups* pinned_ = nullptr;  // on the arena; rows added by Pin
  // Set together by IndexRow only, so the two always name the same keys.
  absl::flat_hash_map<std::string_view, uint32_t> rows_;  // each key's row
  std::vector<std::string_view> match_order_;             // the keys of rows_, by row
};

class PrefixLeases {
 public:
  static constexpr size_t kTokenBytes = 16;
  explicit PrefixLeases(const Clock& clock) : clock_(clock) {}

  uint64_t Add(PrefixLease lease);
  // The pinned lookup of `key` under lease `id` if the lease is live and covers it.
  std::optional<mcstore::v1::KeyReplicas> Find(uint64_t id, std::string_view key,
                                               int64_t* deadline_ms) const;
  // Removes the lease; returns it (to release at the master) if it existed and, when `owner`
  // is given, belongs to it or `token` is its capability (compared in constant time).
  std::optional<PrefixLease> Take(uint64_t id, std::optional<std::string_view> owner = std::nullopt,
                                  std::string_view token = {});
  // Whether lease `id` exists and belongs to `owner`.
  bool OwnedBy(uint64_t id, std::string_view owner) const;
  // Whether lease `id` exists and `owner` holds it or `token` is its capability.
  bool Authorizes(uint64_t id, std::string_view owner, std::string_view token) const;
  // Live leases held by `owner` (expired ones count until pruned).
  size_t CountOwned(const std::string& owner) const;
  // Drops leases past their deadline; returns how many. O(1) until the earliest deadline passes
  // (MatchPrefix calls it every time), then one walk over the leases.
  size_t PruneExpired();
  size_t Count() const;

 private:
  void DisownLocked(const std::string& owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool AuthorizedLocked(const PrefixLease& lease, std::string_view owner,
                               std::string_view token);

  const Clock& clock_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, PrefixLease> leases_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, size_t> owned_ ABSL_GUARDED_BY(mu_);
  // No lease ends before this (a lower bound: a taken lease may have set it).
  int64_t earliest_deadline_ms_ ABSL_GUARDED_BY(mu_) = std::numeric_limits<int64_t>::max();
};

}  // namespace mc::client
