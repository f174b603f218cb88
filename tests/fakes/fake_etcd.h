// An in-process etcd for master/leader_election.h: leases expire on an injected Clock, keys bound
// to an expired lease disappear, and a switch makes every call fail as if etcd were unreachable.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "common/clock.h"
#include "master/leader_election.h"

namespace mc {

#define MC_FAKE_ETCD_CHECK_UP() \
  if (!etcd_.up_) return absl::UnavailableError("etcd unreachable (fake)")

class FakeEtcd {
 public:
  explicit FakeEtcd(const Clock& clock) : clock_(clock) {}

  // One member's view (each master has its own EtcdKv; they share this store).
  class Kv final : public master::EtcdKv {
   public:
    explicit Kv(FakeEtcd& etcd) : etcd_(etcd) {}
    absl::StatusOr<int64_t> GrantLease(int64_t ttl_s) override {
      std::lock_guard<std::mutex> lock(etcd_.mu_);
      MC_FAKE_ETCD_CHECK_UP();
      const int64_t id = ++etcd_.next_lease_;
      etcd_.leases_[id] = Lease{ttl_s * 1000, etcd_.clock_.NowMs() + ttl_s * 1000};
      return id;
    }
    absl::StatusOr<int64_t> KeepAlive(int64_t lease_id) override {
      std::lock_guard<std::mutex> lock(etcd_.mu_);
      MC_FAKE_ETCD_CHECK_UP();
      etcd_.ExpireLocked();
      auto it = etcd_.leases_.find(lease_id);
      if (it == etcd_.leases_.end()) return 0;
      it->second.expires_ms = etcd_.clock_.NowMs() + it->second.ttl_ms;
      return it->second.ttl_ms / 1000;
    }
    absl::Status RevokeLease(int64_t lease_id) override {
      std::lock_guard<std::mutex> lock(etcd_.mu_);
      MC_FAKE_ETCD_CHECK_UP();
      etcd_.RevokeLocked(lease_id);
      return absl::OkStatus();
    }
    absl::StatusOr<bool> CreateIfAbsent(const std::string& key, const std::string& value,
                                        int64_t lease_id) override {
      std::lock_guard<std::mutex> lock(etcd_.mu_);
      MC_FAKE_ETCD_CHECK_UP();
      etcd_.ExpireLocked();
      if (etcd_.kv_.count(key) != 0) return false;
      if (etcd_.leases_.count(lease_id) == 0) return absl::NotFoundError("no such lease");
      etcd_.kv_[key] = {value, lease_id};
      return true;
    }
    absl::StatusOr<std::optional<std::string>> Get(const std::string& key) override {
      std::lock_guard<std::mutex> lock(etcd_.mu_);
      MC_FAKE_ETCD_CHECK_UP();
      etcd_.ExpireLocked();
      auto it = etcd_.kv_.find(key);
      if (it == etcd_.kv_.end()) return std::optional<std::string>();
      return std::optional<std::string>(it->second.first);
    }

   private:
    FakeEtcd& etcd_;
  };

  void SetUp(bool up) {
    std::lock_guard<std::mutex> lock(mu_);
    up_ = up;
  }
  // The key removed (an operator's `etcdctl del`, or its lease revoked elsewhere).
  void Delete(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    kv_.erase(key);
  }
  std::optional<std::string> Value(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    ExpireLocked();
    auto it = kv_.find(key);
    if (it == kv_.end()) return std::nullopt;
    return it->second.first;
  }

 private:
  struct Lease {
    int64_t ttl_ms;
    int64_t expires_ms;
  };
  void RevokeLocked(int64_t id) {
    leases_.erase(id);
    for (auto it = kv_.begin(); it != kv_.end();) {
      it = it->second.second == id ? kv_.erase(it) : std::next(it);
    }
  }
  void ExpireLocked() {
    const int64_t now = clock_.NowMs();
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->second.expires_ms <= now) {
        const int64_t id = it->first;
        it = leases_.erase(it);
        RevokeLocked(id);
      } else {
        ++it;
      }
    }
  }

  const Clock& clock_;
  std::mutex mu_;
  bool up_ = true;
  int64_t next_lease_ = 0;
  std::map<int64_t, Lease> leases_;
  std::map<std::string, std::pair<std::string, int64_t>> kv_;  // key -> (value, lease)
};

#undef MC_FAKE_ETCD_CHECK_UP

}  // namespace mc
