#include "master/capability_minter.h"

#include <utility>

#include "common/checksum.h"

namespace mc::master {

CapabilityMinter::CapabilityMinter(auth::ClusterKeysPtr cluster_keys, const Clock& clock)
    : cluster_keys_(std::move(cluster_keys)),
      clock_(clock),
      root_(auth::RandomBytes(32)),
      owners_(std::make_shared<const OwnerMap>()) {}

std::string CapabilityMinter::Register(const std::string& client_id, uint64_t session,
                                       const auth::ClusterKeys* wrap_keys) {
  const std::string key = auth::DeriveOwnerKey(root_, client_id, session);
  auto owner = std::make_shared<const auth::OwnerKey>(key);
  {
    absl::MutexLock lock(&mu_);
    auto next = std::make_shared<OwnerMap>(*owners_);
    (*next)[client_id] = std::move(owner);
    owners_ = std::move(next);
  }
  return auth::WrapOwnerKey(wrap_keys != nullptr ? *wrap_keys : *cluster_keys_, client_id, key);
}

void CapabilityMinter::Forget(const std::string& client_id) {
  absl::MutexLock lock(&mu_);
  if (!owners_->contains(client_id)) return;
  auto next = std::make_shared<OwnerMap>(*owners_);
  next->erase(client_id);
  owners_ = std::move(next);
}

std::shared_ptr<const CapabilityMinter::OwnerMap> CapabilityMinter::Owners() const {
  absl::ReaderMutexLock lock(&mu_);
  return owners_;
}

bool CapabilityMinter::Batch::Mint(const Replica& replica, auth::Right right, uint64_t generation,
                                   std::string_view key, int64_t expiry_ms,
                                   auth::CapabilityBytes& out) {
  const MemoryLocation& l = replica.location;
  if (last_key_ == nullptr || l.client_id != last_owner_) {
    last_key_ = IsSelf(l.client_id) ? nullptr : Find(l.client_id);
    last_owner_ = l.client_id;
  }
  if (last_key_ == nullptr) return false;
  MintUnder(*last_key_, {replica.tier, l.segment_id, l.offset, l.length}, right, generation, key,
            expiry_ms, out);
  return true;
}

const auth::OwnerKey* CapabilityMinter::Batch::Find(std::string_view client_id) const {
  // Heterogeneous: no string built per lookup.
  auto it = owners_->find(absl::string_view(client_id.data(), client_id.size()));
  return it == owners_->end() ? nullptr : it->second.get();
}

void CapabilityMinter::Batch::MintUnder(const auth::OwnerKey& owner_key, const Target& replica,
                                        auth::Right right, uint64_t generation,
                                        std::string_view key, int64_t expiry_ms,
                                        auth::CapabilityBytes& out) {
  auth::Capability cap;
  cap.right = right;
  cap.offset = replica.offset;
  cap.length = replica.length;
  cap.generation = generation;
  cap.expiry_ms = expiry_ms;
  if (replica.tier == ReplicaTier::kDisk) {
    cap.right = auth::Right::kReadDisk;
    cap.segment_id = generation;
    cap.key_tag = static_cast<uint32_t>(Checksum(key.data(), key.size()));
  } else {
    cap.segment_id = replica.segment_id;
    // A WRITE grant names its key, so the owner records the replica only under it (an INDEX
    // notice naming another key is refused).
    if (right == auth::Right::kWrite) cap.key_binding = auth::WriteKeyBinding(owner_key, key);
  }
  out = auth::MintCapability(owner_key, cap);
}

}  // namespace mc::master
