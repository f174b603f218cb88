#include "master/grpc_answers.h"

#include "master/peer_names.h"
#include "master/peer_slots.h"
#include "proto/packed_lookups.h"

namespace mc::master {

namespace v1 = mcstore::v1;

v1::Tier ToProtoTier(ReplicaTier tier) {
  return tier == ReplicaTier::kMemory ? v1::MEMORY : v1::DISK;
}

namespace {

void SetReplica(ReplicaTier tier, const std::string& client_id, const std::string& endpoint,
                uint64_t segment_id, uint64_t offset, uint64_t length, std::string_view capability,
                v1::Replica* out) {
  out->set_tier(ToProtoTier(tier));
  out->set_client_id(client_id);
  out->set_data_endpoint(endpoint);
  out->set_segment_id(segment_id);
  out->set_offset(offset);
  out->set_length(length);
  if (!capability.empty()) out->set_capability(capability.data(), capability.size());
}

}  // namespace

void ToProto(const StoredReplica& r, v1::Replica* out, std::string_view capability) {
  const PeerNames::Peer& peer = PeerNames::Instance().Get(r.peer);
  SetReplica(r.tier, peer.client_id, peer.endpoint, r.segment_id, r.offset, r.length, capability,
             out);
}

void ToProto(const Replica& r, v1::Replica* out, std::string_view capability) {
  const MemoryLocation& l = r.location;
  SetReplica(r.tier, l.client_id, l.endpoint, l.segment_id, l.offset, l.length, capability, out);
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
    for (const StoredReplica& replica : o.replicas) {
      ToProto(replica, r->add_replicas(), Grant(grants, batch, replica, o.generation, row, cap));
    }
  }
}

void AddColumns(const std::vector<LookupOutcome>& outcomes, const Grants& grants,
                v1::PackedLookups* out) {
  PackedLookupsWriter packed(out, outcomes.size());
  PeerSlots<uint32_t> owners;  // each holder's owner index in `out`, added at its first replica
  std::optional<CapabilityMinter::Batch> batch;
  auth::CapabilityBytes cap;
  for (size_t row = 0; row < outcomes.size(); ++row) {
    const LookupOutcome& o = outcomes[row];
    const absl::string_view message = o.status.message();
    packed.AddRow(ToProtoCode(ToCode(o.status)), {message.data(), message.size()}, o.size,
                  o.checksum, o.generation);
    for (const StoredReplica& r : o.replicas) {
      auto [owner, first] = owners.Slot(r.peer);
      if (first) {
        const PeerNames::Peer& peer = PeerNames::Instance().Get(r.peer);
        *owner = packed.AddOwner(peer.client_id, peer.endpoint);
      }
      packed.AddReplica(ToProtoTier(r.tier), *owner, r.segment_id, r.offset, r.length,
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
              .keys = keys,
              .self = {}};  // a writer is granted its own ranges: they bind the keys written
  }
  return grants;
}

}  // namespace mc::master
