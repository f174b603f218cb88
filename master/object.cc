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
