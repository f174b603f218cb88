#include "client/access/caller_limits.h"

#include "absl/strings/str_cat.h"

namespace mc::client {

void CountLimitRefusal(MetricsRegistry* metrics, const char* limit) {
  if (metrics == nullptr) return;
  metrics
      ->GetCounter("mc_store_limit_refusals_total",
                   "Store calls refused RESOURCE_EXHAUSTED by a per-caller limit, by limit",
                   {{"limit", limit}})
      .Inc();
}

absl::StatusOr<CallerLimits::Admission> CallerLimits::Enter(const std::string& owner,
                                                            const std::string& account_in) {
  const std::string& account = account_in.empty() ? owner : account_in;
  {
    absl::MutexLock lock(&mu_);
    auto own = inflight_.find(owner);
    const uint32_t n = own == inflight_.end() ? 0 : own->second;
    if (options_.max_inflight_per_caller != 0 && n >= options_.max_inflight_per_caller) {
      CountLimitRefusal(metrics_, "inflight");
      return absl::ResourceExhaustedError(
          absl::StrCat("this caller already has ", n,
                       " Store requests in flight, the limit (--store_max_inflight_per_caller)"));
    }
    auto acc = accounts_.find(account);
    const uint32_t shared = acc == accounts_.end() ? 0 : acc->second.requests;
    if (options_.max_inflight_per_account != 0 && shared >= options_.max_inflight_per_account) {
      CountLimitRefusal(metrics_, "inflight_uid");
      return absl::ResourceExhaustedError(
          absl::StrCat("the sessions of this caller's uid already have ", shared,
                       " Store requests in flight, the limit (--store_max_inflight_per_uid)"));
    }
    ++inflight_[owner];
    ++accounts_[account].requests;
  }
  return Admission(this, owner, account);
}

absl::Status CallerLimits::Admission::ReserveSlices(uint64_t slices) {
  if (limits_ == nullptr) return absl::FailedPreconditionError("no admission");
  absl::Status s = limits_->Reserve(account_, slices);
  if (s.ok()) slices_ += slices;
  return s;
}

absl::Status CallerLimits::Reserve(const std::string& account, uint64_t slices) {
  absl::MutexLock lock(&mu_);
  Account& a = accounts_[account];  // present: the admission holds a request of it
  if (options_.max_slices_per_account != 0 &&
      (slices > options_.max_slices_per_account ||
       a.slices > options_.max_slices_per_account - slices)) {
    CountLimitRefusal(metrics_, "slices_uid");
    return absl::ResourceExhaustedError(
        absl::StrCat("the requests in flight of this caller's uid would hold ", a.slices, " + ",
                     slices, " slices, over the limit (--store_max_inflight_slices_per_uid=",
                     options_.max_slices_per_account, "); retry when some ended"));
  }
  if (options_.max_slices != 0 &&
      (slices > options_.max_slices || slices_ > options_.max_slices - slices)) {
    CountLimitRefusal(metrics_, "slices");
    return absl::ResourceExhaustedError(
        absl::StrCat("the daemon's requests in flight would hold ", slices_, " + ", slices,
                     " slices, over the limit (--store_max_inflight_slices=", options_.max_slices,
                     "); retry when some ended"));
  }
  a.slices += slices;
  slices_ += slices;
  return absl::OkStatus();
}

void CallerLimits::Leave(const std::string& owner, const std::string& account, uint64_t slices) {
  absl::MutexLock lock(&mu_);
  if (auto it = inflight_.find(owner); it != inflight_.end() && --it->second == 0) {
    inflight_.erase(it);
  }
  slices_ -= slices;
  if (auto it = accounts_.find(account); it != accounts_.end()) {
    it->second.slices -= slices;
    if (--it->second.requests == 0) accounts_.erase(it);
  }
}

uint32_t CallerLimits::InFlight(const std::string& owner) const {
  absl::MutexLock lock(&mu_);
  auto it = inflight_.find(owner);
  return it == inflight_.end() ? 0 : it->second;
}

uint32_t CallerLimits::AccountInFlight(const std::string& account) const {
  absl::MutexLock lock(&mu_);
  auto it = accounts_.find(account);
  return it == accounts_.end() ? 0 : it->second.requests;
}

uint64_t CallerLimits::SlicesInFlight() const {
  absl::MutexLock lock(&mu_);
  return slices_;
}

uint64_t CallerLimits::AccountSlices(const std::string& account) const {
  absl::MutexLock lock(&mu_);
  auto it = accounts_.find(account);
  return it == accounts_.end() ? 0 : it->second.slices;
}

}  // namespace mc::client
