#include "master/leader_election.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/logging.h"

namespace mc::master {

namespace {
spdlog::logger& Log() { return Logger("election"); }
constexpr int64_t kErrorLogIntervalMs = 5000;
}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case Role::kStarting:
      return "starting";
    case Role::kStandby:
      return "standby";
    case Role::kLeader:
      return "leader";
    case Role::kLost:
      return "lost";
  }
  return "?";
}

LeaderElection::LeaderElection(LeaderElectionOptions options, EtcdKv& kv, const Clock& clock,
                               MetricsRegistry& metrics)
    : options_(std::move(options)),
      ttl_ms_(std::max<int64_t>(options_.ttl_s, 1) * 1000),
      refresh_interval_ms_(ttl_ms_ / 3),
      fence_ms_(ttl_ms_ - (options_.fence_margin_ms > 0 ? options_.fence_margin_ms : ttl_ms_ / 3)),
      kv_(kv),
      clock_(clock),
      leader_gauge_(metrics.GetGauge("mc_master_leader", "1 while this master leads and serves")),
      elections_won_(
          metrics.GetCounter("mc_master_elections_won_total", "Elections this master won (etcd)")),
      etcd_errors_(metrics.GetCounter("mc_master_etcd_errors_total",
                                      "etcd requests that failed (unreachable, refused)")),
      thread_(clock_, [this] {
        const int64_t wait_ms = Step();
        return role() == Role::kLost ? PeriodicThread::kStop : wait_ms;
      }) {}

LeaderElection::~LeaderElection() { Stop(); }

void LeaderElection::Start(std::function<void()> on_lost) {
  on_lost_ = std::move(on_lost);
  Log().info("leader election through etcd: key {}, advertising {}, lease TTL {} s", options_.key,
             options_.advertise, ttl_ms_ / 1000);
  thread_.Start(0);
}

void LeaderElection::Stop() {
  thread_.Stop();
  if (role() == Role::kLeader) {
    serve_until_ms_.store(0);
    absl::Status s = kv_.RevokeLease(lease_id_);
    if (s.ok()) {
      Log().info("stepped down: lease revoked, a standby can take over at once");
    } else {
      // Not fatal: the lease then expires within its TTL.
      CountEtcdError("revoke", s);
    }
    SetRole(Role::kStandby, "");
  }
}

void LeaderElection::CountEtcdError(const char* op, const absl::Status& status) {
  etcd_errors_.Inc();
  const int64_t now = clock_.NowMs();
  if (now - last_error_log_ms_ >= kErrorLogIntervalMs) {
    last_error_log_ms_ = now;
    Log().warn("etcd {} failed ({}); retrying; this master serves nothing until it leads", op,
               status.ToString());
  }
}

void LeaderElection::SetRole(Role role, const std::string& leader) {
  Role before;
  std::string leader_before;
  {
    absl::MutexLock lock(&mu_);
    before = role_;
    leader_before = leader_;
    role_ = role;
    leader_ = leader;
  }
  leader_gauge_.Set(role == Role::kLeader ? 1 : 0);
  if (before != role || leader_before != leader) {
    Log().info("role {} -> {}; leader {}", RoleName(before), RoleName(role),
               leader.empty() ? "unknown" : leader);
  }
}

void LeaderElection::Lose(const std::string& why) {
  serve_until_ms_.store(0);
  SetRole(Role::kLost, "");
  Log().error(
      "lost the leadership ({}): this master stops serving for good and exits; a fresh start "
      "becomes a standby",
      why);
  if (on_lost_) on_lost_();
}

int64_t LeaderElection::Step() {
  switch (role()) {
    case Role::kLeader:
      return StepLeader();
    case Role::kLost:
      return options_.poll_interval_ms;
    default:
      return StepStandby();
  }
}

int64_t LeaderElection::StepStandby() {
  absl::StatusOr<std::optional<std::string>> current = kv_.Get(options_.key);
  if (!current.ok()) {
    CountEtcdError("read of the leader key", current.status());
    SetRole(Role::kStandby, "");
    return options_.poll_interval_ms;
  }
  if (current->has_value()) {
    // The holder may be this address itself: an earlier run of this master whose lease has not
    // expired yet. It is not this process, which waits like any standby.
    SetRole(Role::kStandby, **current);
    return options_.poll_interval_ms;
  }
  const int64_t sent = clock_.NowMs();
  absl::StatusOr<int64_t> lease = kv_.GrantLease(ttl_ms_ / 1000);
  if (!lease.ok()) {
    CountEtcdError("lease grant", lease.status());
    return options_.poll_interval_ms;
  }
  absl::StatusOr<bool> created = kv_.CreateIfAbsent(options_.key, options_.advertise, *lease);
  if (!created.ok() || !*created) {
    if (!created.ok()) CountEtcdError("campaign", created.status());
    // Lost the race (or cannot tell): the lease would expire anyway.
    kv_.RevokeLease(*lease).IgnoreError();
    return created.ok() ? 0 : options_.poll_interval_ms;  // read the winner at once
  }
  lease_id_ = *lease;
  last_refresh_ms_ = sent;
  serve_until_ms_.store(sent + fence_ms_);
  elections_won_.Inc();
  SetRole(Role::kLeader, options_.advertise);
  Log().info("won the election (lease {:x}): serving as leader at {}", lease_id_,
             options_.advertise);
  return refresh_interval_ms_;
}

int64_t LeaderElection::StepLeader() {
  const int64_t now = clock_.NowMs();
  if (now - last_refresh_ms_ >= ttl_ms_) {
    Lose(absl::StrCat("no lease refresh succeeded for ", now - last_refresh_ms_, " ms"));
    return options_.poll_interval_ms;
  }
  const int64_t due = last_refresh_ms_ + refresh_interval_ms_;
  if (now < due) return due - now;
  absl::StatusOr<int64_t> ttl = kv_.KeepAlive(lease_id_);
  if (!ttl.ok()) {
    CountEtcdError("lease refresh", ttl.status());
    // Retry soon; the fence stops serving if this lasts, and a whole TTL loses the lease.
    return std::min<int64_t>(options_.poll_interval_ms, refresh_interval_ms_);
  }
  if (*ttl <= 0) {
    Lose("etcd says the lease expired");
    return options_.poll_interval_ms;
  }
  // The key must still name this master (someone may have deleted it while the lease lived,
  // and a standby then won): two leaders must never serve.
  absl::StatusOr<std::optional<std::string>> holder = kv_.Get(options_.key);
  if (!holder.ok()) {
    CountEtcdError("read of the leader key", holder.status());
    return std::min<int64_t>(options_.poll_interval_ms, refresh_interval_ms_);
  }
  if (!holder->has_value() || **holder != options_.advertise) {
    Lose(absl::StrCat("the election key names ", holder->value_or("nobody"), " now"));
    return options_.poll_interval_ms;
  }
  last_refresh_ms_ = now;
  serve_until_ms_.store(now + fence_ms_);
  return refresh_interval_ms_;
}

bool LeaderElection::Serving() const {
  return clock_.NowMs() < serve_until_ms_.load(std::memory_order_acquire);
}

std::string LeaderElection::LeaderAddress() const {
  absl::MutexLock lock(&mu_);
  return leader_;
}

Role LeaderElection::role() const {
  absl::MutexLock lock(&mu_);
  return role_;
}

int64_t LeaderElection::lease_id() const { return lease_id_; }

std::string LeaderElection::StatusLine() const {
  absl::MutexLock lock(&mu_);
  const bool fenced = role_ == Role::kLeader && !Serving();
  return absl::StrCat("role=", RoleName(role_), fenced ? " (fenced: lease refresh overdue)" : "",
                      " leader=", leader_.empty() ? "unknown" : leader_);
}

}  // namespace mc::master
