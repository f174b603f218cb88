// BatchGetter's per-call state, shared by its two source files: batch_get.cc (lookup,
// destinations, fan-out, leases) and batch_get_reads.cc (the replica read rounds with their
// fallbacks, our own SSD records, fault reports, promotion). Internal to client/batch/.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <google/protobuf/arena.h>

#include "absl/status/status.h"
#include "client/batch/batch_get.h"

namespace mc::client {

namespace batch_get_internal {
// No item (a KeyPlan's `primary` before one is chosen).
inline constexpr size_t kNone = std::numeric_limits<size_t>::max();
}  // namespace batch_get_internal

struct BatchGetter::KeyPlan {
  std::string key;
  std::vector<size_t> items;                   // request positions, ascending
  absl::Status status;                         // key-level outcome (lookup, transfer, verification)
  const v1::KeyReplicas* lookup = nullptr;     // in Batch's arena, or `pinned`; set when status ok
  std::optional<v1::KeyReplicas> pinned;       // a MatchPrefix lease's copy
  int64_t deadline_ms = 0;                     // lease end on the local clock
  bool leased_here = false;                    // this call took the lease (and releases it)
  std::vector<int> order;                      // replica indices, preferred first
  size_t next = 0;                             // next position in `order` to try
  size_t primary = batch_get_internal::kNone;  // item receiving the transfer
  uint64_t moved = 0;                          // bytes moved into the primary by the last transfer
  bool done = false;
  // GPU destinations that need staging (GpuGetStager): the key is read into `staging` (pinned
  // host memory held by `staging_lease`) and every destination is filled from there in FanOut.
  // Empty: the key is read into the primary's own destination.
  GpuGetStager::Lease staging_lease;
  std::vector<LocalBuffer> staging;
};

// A speculative local copy: plan `plan`'s item `item`, copied from the index entry `entry`.
struct BatchGetter::Speculated {
  size_t plan = 0;
  size_t item = 0;
  ObjectIndex::Entry entry;
};

struct BatchGetter::Batch {
  explicit Batch(std::vector<GetRequestItem>& requested)
      : items(requested), results(requested.size()), dest(requested.size()) {}
  // Never leaves a speculative copy writing a destination behind (SettleSpeculation ends it).
  ~Batch() {
    if (spec_job != nullptr) SpeculativeCopier::Finish(*spec_job, {});
  }
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  std::vector<GetRequestItem>& items;
  std::vector<GetItemResult> results;
  std::vector<std::vector<LocalBuffer>> dest;
  std::vector<KeyPlan> plans;
  uint64_t master_lease_id = 0;
  // Self-repair (RepairReplicas): memory replicas that failed the checksum, as (plan, replica),
  // and the holders (client ids) that refused a connection.
  std::vector<std::pair<size_t, int>> mismatched;
  std::vector<std::string> unreachable;
  // Speculative local copies in flight (null: none), one Speculated per item of the job.
  std::shared_ptr<SpeculativeCopier::Job> spec_job;
  std::vector<Speculated> speculated;
  // The master's answer is parsed onto this arena (thousands of small messages and strings per
  // batch, freed at once); plans point into it.
  google::protobuf::Arena arena;
};

}  // namespace mc::client
