// Leader election among mc-masters through etcd (standby masters: docs/operations.md, "HA
// deployment").
//
// A master run with etcd endpoints is a candidate: it serves only while it holds the election
// key (prefix + "leader", value = its advertised gRPC address) bound to an etcd lease it keeps
// alive. The others are standbys: they poll the key and campaign when it is gone. A new leader
// needs no replicated state: it starts empty and the clients re-register and report their
// objects (docs/architecture.md "Restart and return").
//
// Fencing: the leader serves only while its last successful lease refresh was sent less than
// the lease TTL minus a margin ago (steady clock, checked on every RPC), so a leader paused
// (SIGSTOP, a long GC-like stall) refuses at once when it resumes, before it even learns that
// its lease is gone. A leader that loses its lease (a refresh answered "no such lease", no
// refresh succeeded for a whole TTL, or the key no longer names it) stops serving for good and
// calls `on_lost`: the in-memory state of its term must never serve again (mc-master exits
// non-zero; a fresh process starts as a standby).
//
// What it does not do: talk to etcd itself (EtcdKv, master/etcd_http.h implements it over
// etcd's JSON gateway); decide what a refused call answers (master/grpc_service.cc).
// Thread-safe: Serving() is lock-free for the RPC path; Step() runs on one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/periodic_thread.h"

namespace mc::master {

// What the gRPC service asks before every call.
class LeaderGate {
 public:
  virtual ~LeaderGate() = default;
  // True while this master may serve.
  virtual bool Serving() const = 0;
  // The leader's advertised gRPC address when known (it may be this master's), else "".
  virtual std::string LeaderAddress() const = 0;
};

// The few etcd v3 operations the election needs. Errors are transport or server failures.
class EtcdKv {
 public:
  virtual ~EtcdKv() = default;
  // A new lease of `ttl_s` seconds: its id.
  virtual absl::StatusOr<int64_t> GrantLease(int64_t ttl_s) = 0;
  // Refreshes the lease: the TTL etcd answers, 0 (or less) when the lease no longer exists.
  virtual absl::StatusOr<int64_t> KeepAlive(int64_t lease_id) = 0;
  virtual absl::Status RevokeLease(int64_t lease_id) = 0;
  // One transaction: if `key` does not exist, put key=value bound to the lease. True if it did.
  virtual absl::StatusOr<bool> CreateIfAbsent(const std::string& key, const std::string& value,
                                              int64_t lease_id) = 0;
  // The value of `key`; nullopt when it does not exist.
  virtual absl::StatusOr<std::optional<std::string>> Get(const std::string& key) = 0;
};

struct LeaderElectionOptions {
  std::string key = "/mcstore/leader";  // --etcd_prefix + "leader"
  std::string advertise;                // this master's gRPC HOST:PORT, the key's value
  int64_t ttl_s = 3;                    // the etcd lease TTL (--leader_ttl_s)
  int64_t poll_interval_ms = 300;       // how often a standby reads the key
  // Serving stops this long before the lease could expire at etcd; 0 = a third of the TTL.
  // The lease is refreshed every third of the TTL, so a healthy leader never reaches it.
  int64_t fence_margin_ms = 0;
};

enum class Role { kStarting, kStandby, kLeader, kLost };
const char* RoleName(Role role);

class LeaderElection final : public LeaderGate {
 public:
  // `kv`, `clock` and `metrics` are borrowed and must outlive this.
  LeaderElection(LeaderElectionOptions options, EtcdKv& kv, const Clock& clock,
                 MetricsRegistry& metrics);
  ~LeaderElection() override;

  // Runs Step() on a thread of its own until Stop(). `on_lost` is called once, on that thread,
  // when this leader loses its lease.
  void Start(std::function<void()> on_lost);
  // Stops the thread; a leader revokes its lease first (so a standby takes over at once) and
  // stops serving.
  void Stop();

  // One round of the state machine; returns how long to wait before the next one (ms).
  // Standby: read the key; when it is gone, grant a lease and create the key bound to it.
  // Leader: refresh the lease when a third of the TTL has passed since the last refresh, and
  // check that the key still names this master.
  int64_t Step();

  bool Serving() const override;
  std::string LeaderAddress() const override;
  Role role() const;
  // "role=leader leader=HOST:PORT" for /status.
  std::string StatusLine() const;
  int64_t lease_id() const;

 private:
  int64_t StepStandby();
  int64_t StepLeader();
  void SetRole(Role role, const std::string& leader) ABSL_LOCKS_EXCLUDED(mu_);
  void Lose(const std::string& why);
  void CountEtcdError(const char* op, const absl::Status& status);

  const LeaderElectionOptions options_;
  const int64_t ttl_ms_;
  const int64_t refresh_interval_ms_;
  const int64_t fence_ms_;  // serve while now < last refresh + fence_ms_
  EtcdKv& kv_;
  const Clock& clock_;
  Gauge& leader_gauge_;
  Counter& elections_won_;
  Counter& etcd_errors_;
  // The steady-clock ms until which this master may serve; 0 = not leading.
  std::atomic<int64_t> serve_until_ms_{0};

  // Only the stepping thread touches these.
  int64_t lease_id_ = 0;
  int64_t last_refresh_ms_ = 0;  // when the last successful refresh (or the grant) was sent
  int64_t last_error_log_ms_ = -1'000'000'000;

  mutable absl::Mutex mu_;
  Role role_ ABSL_GUARDED_BY(mu_) = Role::kStarting;
  std::string leader_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_lost_;
  PeriodicThread thread_;  // last: it runs Step() on the members above
};

}  // namespace mc::master
