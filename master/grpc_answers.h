// The master's answers built from domain outcomes (master/grpc_service.cc's handlers, which the
// lane calls too, fill their responses with these): replicas as protos, lookups as records or
// packed columns, placements with their write grants, per-item results. Each replica of an answer
// carries the capability minted for it under the answer's Grants (none with --auth=false, nor
// for the replicas a lookup's asker holds itself). Plain functions, thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/auth.h"
#include "common/status.h"
#include "master/capability_minter.h"
#include "master/master_types.h"
#include "mcstore/v1/master.pb.h"
#include "proto/status_convert.h"

namespace mc::master {

mcstore::v1::Tier ToProtoTier(ReplicaTier tier);

void ToProto(const Replica& r, mcstore::v1::Replica* out, std::string_view capability = {});
void ToProto(const StoredReplica& r, mcstore::v1::Replica* out, std::string_view capability = {});

// What the replicas of an answer are granted: nothing without a minter (--auth=false).
struct Grants {
  CapabilityMinter* minter = nullptr;
  auth::Right right = auth::Right::kRead;
  int64_t expiry_ms = 0;
  // The answered keys, row by row (lookups: for a DISK replica's key tag); may be shorter.
  std::span<const std::string_view> keys;
  // Lookups: the asking client, whose own replicas are granted nothing (it reads them
  // directly); empty: every replica is granted (CapabilityMinter::Batch).
  std::string_view self;
};

// The capability of `replica` (a Replica or StoredReplica) of row `row` under `grants` (a view of
// `out`), or empty.
template <typename R>
std::string_view Grant(const Grants& grants, std::optional<CapabilityMinter::Batch>& batch,
                       const R& replica, uint64_t generation, size_t row,
                       auth::CapabilityBytes& out) {
  if (grants.minter == nullptr) return {};
  if (!batch) batch.emplace(*grants.minter, grants.self);
  const std::string_view key = row < grants.keys.size() ? grants.keys[row] : std::string_view();
  if (!batch->Mint(replica, grants.right, generation, key, grants.expiry_ms, out)) return {};
  return {reinterpret_cast<const char*>(out.data()), out.size()};
}

// A lookup's outcomes as one record per key.
void AddRecords(const std::vector<LookupOutcome>& outcomes, const Grants& grants,
                mcstore::v1::GetReplicasResponse* resp);

// The same outcomes as columns (PackedLookups).
void AddColumns(const std::vector<LookupOutcome>& outcomes, const Grants& grants,
                mcstore::v1::PackedLookups* out);

std::vector<DiskReplicaItem> DiskItems(
    const google::protobuf::RepeatedPtrField<mcstore::v1::DiskReplicaItem>& items);

// The writer stops writing write_deadline_ms after it sent PutStart; the grant ends then too
// (counted from now, a little after it sent), long before the put is revoked (2x). Each grant
// binds its row's key (`keys`, one per requested item): the owner records the replica under no
// other (an INDEX notice naming another key is refused).
Grants WriteGrants(CapabilityMinter* minter, int64_t write_deadline_ms,
                   std::span<const std::string_view> keys);

// Placements of PutStart and PromoteStart, with the writers' deadline.
template <typename Response>
void AddPlacements(const std::vector<PutStartOutcome>& outcomes, int64_t write_deadline_ms,
                   const Grants& grants, Response* resp) {
  std::optional<CapabilityMinter::Batch> batch;
  auth::CapabilityBytes cap;
  for (size_t row = 0; row < outcomes.size(); ++row) {
    const PutStartOutcome& o = outcomes[row];
    mcstore::v1::PutStartResult* r = resp->add_results();
    r->set_code(ToProtoCode(ToCode(o.status)));
    r->set_message(std::string(o.status.message()));
    r->set_generation(o.generation);
    r->set_no_space_final(o.no_space_final);
    r->set_write_back_pending(o.write_back_pending);
    for (const Replica& replica : o.replicas) {
      ToProto(replica, r->add_replicas(), Grant(grants, batch, replica, o.generation, row, cap));
    }
  }
  resp->set_write_deadline_ms(write_deadline_ms);
}

template <typename Response>
void AddResults(const std::vector<absl::Status>& statuses, Response* response) {
  for (const auto& s : statuses) SetResult(s, response->add_results());
}

}  // namespace mc::master
