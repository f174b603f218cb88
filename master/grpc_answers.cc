#include "master/grpc_answers.h"

#include "proto/packed_lookups.h"

namespace mc::master {

namespace v1 = mcstore::v1;

v1::Tier ToProtoTier(ReplicaTier tier) {
  return tier == ReplicaTier::kMemory ? v1::MEMORY : v1::DISK;
}

void ToProto(const Replica& r, v1::Replica* out, std::string_view capability) {
  out->set_tier(ToProtoTier(r.tier));
  out->set_client_id(r.location.client_id);
  out->set_data_endpoint(r.location.endpoint);
  out->set_segment_id(r.location.segment_id);
  out->set_offset(r.location.offset);
  out->set_length(r.location.length);
  if (!capability.empty()) out->set_capability(capability.data(), capability.size());
}

std::string_view Grant(const Grants& grants, std::optional<CapabilityMinter::Batch>& batch,
                       const Replica& replica, uint64_t generation, size_t row,
                       auth::CapabilityBytes& out) {
  if (grants.minter == nullptr) return {};
  if (!batch) batch.emplace(*grants.minter);
  const std::string_view key = row < grants.keys.size() ? grants.keys[row] : std::string_view();
  if (!batch->Mint(replica, grants.right, generation, key, grants.expiry_ms, out)) return {};
  return {reinterpret_cast<const char*>(out.data()), out.size()};
}

void AddRecords(const std::vector<LookupOutcome>& outcomes, const Grants& grants,
                v1::GetReplicasResponse* resp) {
  std::optional<CapabilityMinter::Batch> batch;
  auth::CapabilityBytes cap;
  for (size_t row = 0; row < outcomes.size(); ++row) {
    const LookupOutcome& o = outcomes[row];
    v1::KeyReplicas* r = resp->add_results();
    r->set_code(ToProtoCode(ToCode(o.status)));
    if (!o.status.ok()) r->set_message(std::string(o.status.message()));
    r->set_size(o.size);
    r->set_checksum(o.checksum);
    r->set_generation(o.generation);
    for (const Replica& replica : o.replicas) {
      ToProto(replica, r->add_replicas(), Grant(grants, batch, replica, o.generation, row, cap));
    }
  }
}

void AddColumns(const std::vector<LookupOutcome>& outcomes, const Grants& grants,
                v1::PackedLookups* out) {
  PackedLookupsWriter packed(out, outcomes.size());
  std::optional<CapabilityMinter::Batch> batch;
  auth::CapabilityBytes cap;
  for (size_t row = 0; row < outcomes.size(); ++row) {
    const LookupOutcome& o = outcomes[row];
    const absl::string_view message = o.status.message();
    packed.AddRow(ToProtoCode(ToCode(o.status)), {message.data(), message.size()}, o.size,
                  o.checksum, o.generation);
    for (const Replica& r : o.replicas) {
      packed.AddReplica(ToProtoTier(r.tier), r.location.client_id, r.location.endpoint,
                        r.location.segment_id, r.location.offset, r.location.length,
                        Grant(grants, batch, r, o.generation, row, cap));
    }
  }
}

std::vector<DiskReplicaItem> DiskItems(
    const google::protobuf::RepeatedPtrField<v1::DiskReplicaItem>& items) {
  std::vector<DiskReplicaItem> out;
  for (const auto& item : items) {
    out.push_back({item.key(), item.generation(), item.locator(), item.length(), item.checksum()});
  }
  return out;
}

Grants WriteGrants(CapabilityMinter* minter, int64_t write_deadline_ms,
                   std::span<const std::string_view> keys) {
  Grants grants;
  if (minter != nullptr) {
    grants = {.minter = minter,
              .right = auth::Right::kWrite,
              .expiry_ms = minter->NowMs() + write_deadline_ms,
              .keys = keys};
  }
  return grants;
}

}  // namespace mc::master
