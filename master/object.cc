#include "master/object.h"

#include <algorithm>

namespace mc::master {

StoredReplica StoredReplica::Of(const Replica& replica) {
  const MemoryLocation& l = replica.location;
  StoredReplica r;
  r.segment_id = l.segment_id;
  r.offset = l.offset;
  r.length = l.length;
  r.generation = l.generation;
  r.peer = PeerNames::Instance().Intern(l.client_id, l.endpoint);
  r.tier = replica.tier;
  return r;
}

MemoryLocation StoredReplica::location() const {
  const PeerNames::Peer& p = PeerNames::Instance().Get(peer);
  return MemoryLocation{p.client_id, p.endpoint, segment_id, offset, length, generation};
}

Object::Transient& Object::MutableTransient() {
  if (!transient_) transient_ = std::make_unique<Transient>();
  return *transient_;
}

void Object::TrimTransient() {
  if (transient_ && transient_->Empty()) transient_.reset();
}

void Object::StartPromotion(Promotion promotion) {
  MutableTransient().promotion = std::make_unique<Promotion>(std::move(promotion));
}

void Object::EndPromotion() {
  if (!transient_) return;
  transient_->promotion.reset();
  TrimTransient();
}

const Object::Leases& Object::leases() const {
  static const Leases kNone;
  return transient_ ? transient_->leases : kNone;
}

size_t Object::PruneLeases(int64_t now_ms) {
  if (!transient_) return 0;
  Leases& leases = transient_->leases;
  size_t before = leases.size();
  leases.erase(std::remove_if(leases.begin(), leases.end(),
                              [now_ms](const Lease& l) { return l.expiry_ms <= now_ms; }),
               leases.end());
  return before - leases.size();
}

bool Object::HasLiveLease(int64_t now_ms) const {
  const Leases& all = leases();
  return std::any_of(all.begin(), all.end(),
                     [now_ms](const Lease& l) { return l.expiry_ms > now_ms; });
}

LeaseRelease Object::ReleaseLease(uint64_t id, uint64_t owner, int64_t now_ms) {
  if (!transient_) return LeaseRelease::kNotHeld;
  Leases& leases = transient_->leases;
  for (size_t i = 0; i < leases.size(); ++i) {
    if (leases[i].id != id) continue;
    if (leases[i].owner != owner) return LeaseRelease::kNotOwner;
    bool live = leases[i].expiry_ms > now_ms;
    leases.erase(leases.begin() + static_cast<std::ptrdiff_t>(i));
    return live ? LeaseRelease::kReleased : LeaseRelease::kNotHeld;
  }
  return LeaseRelease::kNotHeld;
}

bool Object::HasMemoryReplica() const {
  return std::any_of(replicas.begin(), replicas.end(),
                     [](const StoredReplica& r) { return r.tier == ReplicaTier::kMemory; });
}

bool Object::HasDiskReplica() const {
  return std::any_of(replicas.begin(), replicas.end(),
                     [](const StoredReplica& r) { return r.tier == ReplicaTier::kDisk; });
}

bool Object::HasDiskReplicaOn(const std::string& client_id) const {
  return std::any_of(replicas.begin(), replicas.end(), [&](const StoredReplica& r) {
    return r.tier == ReplicaTier::kDisk && r.client_id() == client_id;
  });
}

}  // namespace mc::master
