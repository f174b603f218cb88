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

absl::StatusOr<CallerLimits::Admission> CallerLimits::Enter(const std::string& owner) {
  {
    absl::MutexLock lock(&mu_);
    uint32_t& n = inflight_[owner];
    if (max_inflight_ != 0 && n >= max_inflight_) {
      if (n == 0) inflight_.erase(owner);
      CountLimitRefusal(metrics_, "inflight");
      return absl::ResourceExhaustedError(
          absl::StrCat("this caller already has ", max_inflight_,
                       " Store requests in flight, the limit (--store_max_inflight_per_caller)"));
    }
    ++n;
  }
  return Admission(this, owner);
}

void CallerLimits::Leave(const std::string& owner) {
  absl::MutexLock lock(&mu_);
  auto it = inflight_.find(owner);
  if (it == inflight_.end()) return;
  if (--it->second == 0) inflight_.erase(it);
}

uint32_t CallerLimits::InFlight(const std::string& owner) const {
  absl::MutexLock lock(&mu_);
  auto it = inflight_.find(owner);
  return it == inflight_.end() ? 0 : it->second;
}

}  // namespace mc::client
