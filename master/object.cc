#include "master/object.h"

#include <algorithm>

namespace mc::master {

size_t Object::PruneLeases(int64_t now_ms) {
  size_t before = leases.size();
  std::erase_if(leases, [now_ms](const Lease& l) { return l.expiry_ms <= now_ms; });
  return before - leases.size();
}

bool Object::HasLiveLease(int64_t now_ms) const {
  return std::any_of(leases.begin(), leases.end(),
                     [now_ms](const Lease& l) { return l.expiry_ms > now_ms; });
}

LeaseRelease Object::ReleaseLease(uint64_t id, uint64_t owner, int64_t now_ms) {
  for (size_t i = 0; i < leases.size(); ++i) {
    if (leases[i].id != id) continue;
    if (leases[i].owner != owner) return LeaseRelease::kNotOwner;
    bool live = leases[i].expiry_ms > now_ms;
    leases.erase(leases.begin() + i);
    return live ? LeaseRelease::kReleased : LeaseRelease::kNotHeld;
  }
  return LeaseRelease::kNotHeld;
}

bool Object::HasMemoryReplica() const {
  return std::any_of(replicas.begin(), replicas.end(),
                     [](const Replica& r) { return r.tier == ReplicaTier::kMemory; });
}

bool Object::HasDiskReplica() const {
  return std::any_of(replicas.begin(), replicas.end(),
                     [](const Replica& r) { return r.tier == ReplicaTier::kDisk; });
}

bool Object::HasDiskReplicaOn(const std::string& client_id) const {
  return std::any_of(replicas.begin(), replicas.end(), [&](const Replica& r) {
    return r.tier == ReplicaTier::kDisk && r.location.client_id == client_id;
  });
}

}  // namespace mc::master
