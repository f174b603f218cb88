#include "client/batch/prefix_leases.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/auth.h"
#include "common/status_macros.h"

namespace mc::client {

uint64_t PrefixLeases::Add(PrefixLease lease) {
  absl::MutexLock lock(&mu_);
  uint64_t id = next_id_++;
  earliest_deadline_ms_ = std::min(earliest_deadline_ms_, lease.deadline_ms);
  ++owned_[lease.owner];
  leases_.emplace(id, std::move(lease));
  return id;
}

void PrefixLease::IndexRow(std::string_view key, uint32_t row) {
  if (rows_.emplace(key, row).second) match_order_.push_back(key);
}

void PrefixLease::IndexRows(const std::vector<std::string_view>& by_row) {
  rows_.reserve(rows_.size() + by_row.size());
  match_order_.reserve(match_order_.size() + by_row.size());
  for (size_t row = 0; row < by_row.size(); ++row) {
    IndexRow(by_row[row], static_cast<uint32_t>(row));
  }
}

void PrefixLease::Pin(std::string_view key, const mcstore::v1::KeyReplicas& lookup) {
  if (pinned_ == nullptr) {
    pinned_ = google::protobuf::Arena::CreateMessage<mcstore::v1::PackedLookups>(arena.get());
  }
  PackedLookupsWriter(pinned_).AddRow(lookup);
  auto* stored_key = google::protobuf::Arena::Create<std::string>(arena.get(), key);
  IndexRow(*stored_key, static_cast<uint32_t>(pinned_->codes_size() - 1));
  auto reader = PackedLookupsReader::Open(*pinned_);
  MC_CHECK(reader.ok());  // the writer keeps the columns whole
  lookups = *std::move(reader);
}

std::optional<mcstore::v1::KeyReplicas> PrefixLeases::Find(uint64_t id, std::string_view key,
                                                           int64_t* deadline_ms) const {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.deadline_ms <= clock_.NowMs()) return std::nullopt;
  const std::optional<uint32_t> row = it->second.RowOf(key);
  if (!row.has_value()) return std::nullopt;
  *deadline_ms = it->second.deadline_ms;
  mcstore::v1::KeyReplicas lookup;
  it->second.lookups.Unpack(*row, &lookup);
  return lookup;
}

void PrefixLeases::DisownLocked(const std::string& owner) {
  auto it = owned_.find(owner);
  if (it != owned_.end() && --it->second == 0) owned_.erase(it);
}

bool PrefixLeases::AuthorizedLocked(const PrefixLease& lease, std::string_view owner,
                                    std::string_view token) {
  if (lease.owner == owner) return true;
  return !token.empty() && !lease.token.empty() && auth::ConstantTimeEqual(lease.token, token);
}

std::optional<PrefixLease> PrefixLeases::Take(uint64_t id, std::optional<std::string_view> owner,
                                              std::string_view token) {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(id);
  if (it == leases_.end()) return std::nullopt;
  if (owner && !AuthorizedLocked(it->second, *owner, token)) return std::nullopt;
  PrefixLease lease = std::move(it->second);
  leases_.erase(it);
  DisownLocked(lease.owner);
  return lease;
}

bool PrefixLeases::OwnedBy(uint64_t id, std::string_view owner) const {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(id);
  return it != leases_.end() && it->second.owner == owner;
}

bool PrefixLeases::Authorizes(uint64_t id, std::string_view owner, std::string_view token) const {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(id);
  return it != leases_.end() && AuthorizedLocked(it->second, owner, token);
}

size_t PrefixLeases::CountOwned(const std::string& owner) const {
  absl::MutexLock lock(&mu_);
  auto it = owned_.find(owner);
  return it == owned_.end() ? 0 : it->second;
}

size_t PrefixLeases::PruneExpired() {
  absl::MutexLock lock(&mu_);
  int64_t now = clock_.NowMs();
  if (now < earliest_deadline_ms_) return 0;
  size_t n = 0;
  earliest_deadline_ms_ = std::numeric_limits<int64_t>::max();
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.deadline_ms <= now) {
      DisownLocked(it->second.owner);
      leases_.erase(it++);
      ++n;
    } else {
      earliest_deadline_ms_ = std::min(earliest_deadline_ms_, it->second.deadline_ms);
      ++it;
    }
  }
  return n;
}

size_t PrefixLeases::Count() const {
  absl::MutexLock lock(&mu_);
  return leases_.size();
}

}  // namespace mc::client
