// CallerLimits: how much of the daemon's Store request capacity one caller may hold at once, so
// that one application cannot take every handler thread or the daemon's memory while the others
// wait.
//  - Requests in flight per caller (owner key, see client/access/store_auth.h;
//    --store_max_inflight_per_caller) and per account (every session of one uid together,
//    --store_max_inflight_per_uid): opening more sessions does not multiply a share.
//  - Request slices in flight (what a request costs the daemon's memory once its items and block
//    layouts are expanded, tens of bytes each): per account (--store_max_inflight_slices_per_uid)
//    and daemon-wide (--store_max_inflight_slices), reserved by the request before it expands.
// Enter() admits a request; Admission::ReserveSlices() takes its slices; both answer
// RESOURCE_EXHAUSTED naming the flag (counted in mc_store_limit_refusals_total{limit}), and the
// Admission gives everything back when destroyed. A 0 limit is unlimited. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"

namespace mc::client {

// Counts one refusal in mc_store_limit_refusals_total{limit} (metrics may be null).
void CountLimitRefusal(MetricsRegistry* metrics, const char* limit);

struct CallerLimitsOptions {
  uint32_t max_inflight_per_caller = 256;        // --store_max_inflight_per_caller
  uint32_t max_inflight_per_account = 1024;      // --store_max_inflight_per_uid
  uint64_t max_slices = 16ull << 20;             // --store_max_inflight_slices
  uint64_t max_slices_per_account = 8ull << 20;  // --store_max_inflight_slices_per_uid
};

class CallerLimits {
 public:
  class Admission {
   public:
    Admission() = default;
    Admission(Admission&& other) noexcept
        : limits_(std::exchange(other.limits_, nullptr)),
          owner_(std::move(other.owner_)),
          account_(std::move(other.account_)),
          slices_(std::exchange(other.slices_, 0)) {}
    Admission& operator=(Admission&& other) noexcept {
      if (this != &other) {
        End();
        limits_ = std::exchange(other.limits_, nullptr);
        owner_ = std::move(other.owner_);
        account_ = std::move(other.account_);
        slices_ = std::exchange(other.slices_, 0);
      }
      return *this;
    }
    ~Admission() { End(); }

    // Takes `slices` more of the account's and the daemon's slice budgets for this request
    // (given back with the admission). RESOURCE_EXHAUSTED when either would be exceeded.
    absl::Status ReserveSlices(uint64_t slices);
    uint64_t slices() const { return slices_; }

   private:
    friend class CallerLimits;
    Admission(CallerLimits* limits, std::string owner, std::string account)
        : limits_(limits), owner_(std::move(owner)), account_(std::move(account)) {}
    void End() {
      if (limits_ != nullptr) limits_->Leave(owner_, account_, slices_);
      limits_ = nullptr;
      slices_ = 0;
    }

    CallerLimits* limits_ = nullptr;
    std::string owner_;
    std::string account_;
    uint64_t slices_ = 0;
  };

  // `metrics` (nullable) is borrowed.
  CallerLimits(CallerLimitsOptions options, MetricsRegistry* metrics)
      : options_(options), metrics_(metrics) {}

  // Admits a request of `owner` whose account is `account` (empty: the owner's own).
  absl::StatusOr<Admission> Enter(const std::string& owner, const std::string& account = "");
  uint32_t InFlight(const std::string& owner) const;
  uint32_t AccountInFlight(const std::string& account) const;
  uint64_t SlicesInFlight() const;
  uint64_t AccountSlices(const std::string& account) const;

 private:
  struct Account {
    uint32_t requests = 0;
    uint64_t slices = 0;
  };
  absl::Status Reserve(const std::string& account, uint64_t slices);
  void Leave(const std::string& owner, const std::string& account, uint64_t slices);

  const CallerLimitsOptions options_;
  MetricsRegistry* const metrics_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, uint32_t> inflight_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Account> accounts_ ABSL_GUARDED_BY(mu_);
  uint64_t slices_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mc::client
