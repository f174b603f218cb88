#include "master/shard_leases.h"

#include <algorithm>

#include "common/status_macros.h"

namespace mc::master {

size_t ShardLeases::Grant(const Object* object, std::string_view key, const Lease& lease,
                          int64_t now_ms) {
  auto [it, fresh] = by_object_.try_emplace(object);
  const size_t expired = fresh ? 0 : Prune(it->second, now_ms);
  std::unique_ptr<GrantRecord>& record = grants_[lease.id];
  if (record == nullptr) record = TakeSpare();
  const size_t slot = record->objects.size();
  MC_CHECK(slot < UINT32_MAX && record->keys.size() + key.size() <= UINT32_MAX);
  record->objects.push_back(object);
  record->keys.append(key);
  record->key_ends.push_back(static_cast<uint32_t>(record->keys.size()));
  ++record->held;
  Lease granted = lease;
  granted.slot = static_cast<uint32_t>(slot);
  it->second.push_back(granted);
  return expired;
}

std::optional<LeaseRelease> ShardLeases::ReleaseGranted(uint64_t id, std::string_view key,
                                                        uint64_t owner, int64_t now_ms,
                                                        size_t* expired) {
  auto record_it = grants_.find(id);
  if (record_it == grants_.end()) return std::nullopt;
  GrantRecord& record = *record_it->second;
  const size_t slot = record.cursor;
  if (slot >= record.objects.size() || record.KeyAt(slot) != key) return std::nullopt;
  const Object* object = record.objects[slot];
  if (object == nullptr) {
    // The lease granted there has ended already; the same batch may hold another lease on the
    // same key (named twice), which only the object knows: the probe answers.
    ++record.cursor;
    return std::nullopt;
  }
  auto it = by_object_.find(object);
  MC_CHECK(it != by_object_.end());
  Leases& leases = it->second;
  size_t i = IndexOf(leases, id, slot);
  // Another owner's lease, or an expired one: answered as the probe answers (expired leases
  // pruned and counted first; kNotOwner changes nothing else). Only a matching owner moves the
  // cursor on.
  if (leases[i].owner != owner) return Release(object, id, owner, now_ms, expired);
  ++record.cursor;
  if (leases[i].expiry_ms <= now_ms) return Release(object, id, owner, now_ms, expired);
  if (leases.size() > 1) {
    // Others may have expired: prune them, then find this one again (it is live, so it stays).
    *expired += Prune(leases, now_ms);
    i = IndexOf(leases, id, slot);
  }
  Remove(it, i);  // may free the record (and `record` with it)
  return LeaseRelease::kReleased;
}

LeaseRelease ShardLeases::Release(const Object* object, uint64_t id, uint64_t owner, int64_t now_ms,
                                  size_t* expired) {
  auto it = by_object_.find(object);
  if (it == by_object_.end()) return LeaseRelease::kNotHeld;
  Leases& leases = it->second;
  *expired += Prune(leases, now_ms);
  for (size_t i = 0; i < leases.size(); ++i) {
    if (leases[i].id != id) continue;
    if (leases[i].owner != owner) return LeaseRelease::kNotOwner;
    Remove(it, i);
    return LeaseRelease::kReleased;  // Prune left only live leases
  }
  if (leases.empty()) by_object_.erase(it);
  return LeaseRelease::kNotHeld;
}

const ShardLeases::Leases& ShardLeases::Of(const Object* object) const {
  static const Leases kNone;
  auto it = by_object_.find(object);
  return it == by_object_.end() ? kNone : it->second;
}

bool ShardLeases::HasLive(const Object* object, int64_t now_ms) const {
  const Leases& all = Of(object);
  return std::any_of(all.begin(), all.end(),
                     [now_ms](const Lease& l) { return l.expiry_ms > now_ms; });
}

void ShardLeases::Forget(const Object* object) {
  auto it = by_object_.find(object);
  if (it == by_object_.end()) return;
  for (const Lease& lease : it->second) Ended(lease);
  by_object_.erase(it);
}

size_t ShardLeases::IndexOf(const Leases& leases, uint64_t id, size_t slot) {
  size_t i = 0;
  while (i < leases.size() && !(leases[i].id == id && leases[i].slot == slot)) ++i;
  MC_CHECK(i < leases.size());  // a record entry that names an object has its lease there
  return i;
}

size_t ShardLeases::Prune(Leases& leases, int64_t now_ms) {
  const size_t before = leases.size();
  leases.erase(std::remove_if(leases.begin(), leases.end(),
                              [&](const Lease& l) {
                                if (l.expiry_ms > now_ms) return false;
                                Ended(l);
                                return true;
                              }),
               leases.end());
  return before - leases.size();
}

void ShardLeases::Ended(const Lease& lease) {
  auto it = grants_.find(lease.id);
  MC_CHECK(it != grants_.end());
  GrantRecord& record = *it->second;
  MC_CHECK(lease.slot < record.objects.size() && record.objects[lease.slot] != nullptr);
  record.objects[lease.slot] = nullptr;
  if (--record.held > 0) return;
  std::unique_ptr<GrantRecord> spent = std::move(it->second);
  grants_.erase(it);
  if (spare_.size() < kSpareGrants && spent->keys.capacity() <= kSpareGrantKeyBytes &&
      spent->objects.capacity() <= kSpareGrantEntries) {
    spent->objects.clear();
    spent->key_ends.clear();
    spent->keys.clear();
    spent->cursor = 0;
    spare_.push_back(std::move(spent));
  }
}

void ShardLeases::Remove(ByObject::iterator it, size_t i) {
  Leases& leases = it->second;
  Ended(leases[i]);
  leases.erase(leases.begin() + static_cast<std::ptrdiff_t>(i));
  if (leases.empty()) by_object_.erase(it);
}

std::unique_ptr<ShardLeases::GrantRecord> ShardLeases::TakeSpare() {
  if (spare_.empty()) return std::make_unique<GrantRecord>();
  std::unique_ptr<GrantRecord> record = std::move(spare_.back());
  spare_.pop_back();
  return record;
}

}  // namespace mc::master
