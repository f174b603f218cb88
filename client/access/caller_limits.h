// CallerLimits: how many Store requests each caller (owner key, see client/access/store_auth.h) may
// have in flight at once, so that one application cannot take every handler thread or pile up
// puts and gets while the others wait. Enter() admits a request or answers RESOURCE_EXHAUSTED
// naming --store_max_inflight_per_caller (counted in mc_store_limit_refusals_total{limit=
// "inflight"}); the returned Admission ends it when destroyed. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"

namespace mc::client {

class CallerLimits {
 public:
  class Admission {
   public:
    Admission() = default;
    Admission(CallerLimits* limits, std::string owner)
        : limits_(limits), owner_(std::move(owner)) {}
    Admission(Admission&& other) noexcept
        : limits_(std::exchange(other.limits_, nullptr)), owner_(std::move(other.owner_)) {}
    Admission& operator=(Admission&& other) noexcept {
      if (this != &other) {
        if (limits_ != nullptr) limits_->Leave(owner_);
        limits_ = std::exchange(other.limits_, nullptr);
        owner_ = std::move(other.owner_);
      }
      return *this;
    }
    ~Admission() {
      if (limits_ != nullptr) limits_->Leave(owner_);
    }

   private:
    CallerLimits* limits_ = nullptr;
    std::string owner_;
  };

  // max_inflight 0 = unlimited. `metrics` (nullable) is borrowed.
  CallerLimits(uint32_t max_inflight, MetricsRegistry* metrics)
      : max_inflight_(max_inflight), metrics_(metrics) {}

  absl::StatusOr<Admission> Enter(const std::string& owner);
  uint32_t InFlight(const std::string& owner) const;

 private:
  void Leave(const std::string& owner);

  const uint32_t max_inflight_;
  MetricsRegistry* const metrics_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, uint32_t> inflight_ ABSL_GUARDED_BY(mu_);
};

// Counts one refusal by a per-caller limit (mc_store_limit_refusals_total{limit}).
void CountLimitRefusal(MetricsRegistry* metrics, const char* limit);

}  // namespace mc::client
