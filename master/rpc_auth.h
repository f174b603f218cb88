// RpcAuthenticator: who is calling the Master service (docs/security.md).
//
// Checks the registration and admin proofs of common/master_credentials.h: the MAC under the
// cluster keys (any secret of a rotation verifies), that the proof names this master run (a
// random run id drawn here at start and answered to Hello: the replay cache below is in memory,
// so a proof of an earlier run, or made for another master, would otherwise pass it again), the
// proof's time against this host's clock (within max_clock_skew_ms either way) and that its
// nonce was not seen before (a bounded replay cache that remembers each nonce for twice the
// skew window, so a proof cannot be used twice).
// It also counts and logs (rate-limited) every refused call by reason, in
// mc_master_auth_failures_total{reason}. Session tokens themselves are checked against the
// ClientRegistry, which owns them; this class does not know sessions.
// Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/master_credentials.h"
#include "common/metrics.h"

namespace mc::master {

// The authenticated caller of one RPC, as the handlers see it.
struct Caller {
  enum class Kind {
    kAnyone,      // authentication is off (--auth=false): requests speak for themselves
    kRegistrant,  // RegisterClient with a valid proof for `client_id`
    kClient,      // a registered client's session
    kAdmin,       // a read-only admin proof (GetStatus)
  };
  Kind kind = Kind::kAnyone;
  std::string client_id;
  uint64_t session = 0;  // kClient: its session number (owns its leases); else 0
  // kRegistrant: the token of the session it is replacing, when it presented one (the proof that
  // it is the same daemon re-registering); empty otherwise.
  std::string previous_token;
  bool authenticated() const { return kind != Kind::kAnyone; }
};

// Why a call was refused; the label of mc_master_auth_failures_total.
enum class AuthFailure {
  kMissing,          // no credential where one is needed
  kMalformed,        // unparsable metadata (fields, hex, size)
  kBadMac,           // the MAC does not verify under any secret
  kStale,            // the proof's time is outside the window
  kReplay,           // the nonce was used before
  kReplayCacheFull,  // too many proofs inside one window: refused, fail closed
  kUnknownSession,   // no live session has this token (or the master restarted)
  kWrongClient,      // the request names another client than the credential
  kWrongRole,        // e.g. an admin proof on a client RPC
  kOtherRun,         // a proof made for another master run (before a restart, or another master)
  kCount,
};
std::string_view AuthFailureName(AuthFailure reason);

struct RpcAuthOptions {
  int64_t max_clock_skew_ms = 60'000;     // a proof's time may differ this much from ours
  size_t replay_cache_entries = 100'000;  // nonces remembered at most (2 * skew each)
  // Milliseconds since the Unix epoch; tests inject a fake. Default: the system clock.
  std::function<int64_t()> unix_now_ms;
};

class RpcAuthenticator {
 public:
  // `keys` must not be null.
  RpcAuthenticator(auth::ClusterKeysPtr keys, RpcAuthOptions options, MetricsRegistry& metrics);

  // OK when `value` (an x-mc-auth metadata value) is a fresh, unused proof for `role`, `id` and
  // `endpoint` (the data endpoint of a registration; empty for admin). Otherwise UNAUTHENTICATED
  // with `*reason` set; the failure is NOT counted here (the caller counts it with the RPC).
  // A proof is remembered only once its MAC verified, so junk cannot fill the replay cache.
  absl::Status CheckProof(std::string_view value, auth::ProofRole role, std::string_view id,
                          std::string_view endpoint, AuthFailure* reason);

  // This master run's id (kRunIdSize random bytes), answered to Hello.
  const std::string& run_id() const { return run_id_; }

  // Counts a refused call and logs it (at most every few seconds).
  void CountFailure(std::string_view rpc, AuthFailure reason, std::string_view detail);
  uint64_t Failures(AuthFailure reason) const;
  size_t ReplayCacheSizeForTest();

 private:
  int64_t NowMs() const;
  // True when `nonce_hex` was not seen in the window (and remembers it).
  bool RememberNonce(const std::string& nonce_hex, int64_t now_ms, AuthFailure* reason)
      ABSL_LOCKS_EXCLUDED(mu_);

  const auth::ClusterKeysPtr keys_;
  const RpcAuthOptions options_;
  const std::string run_id_;
  Counter* failures_[static_cast<int>(AuthFailure::kCount)];
  absl::Mutex mu_;
  absl::flat_hash_set<std::string> nonces_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<int64_t, std::string>> nonce_expiry_ ABSL_GUARDED_BY(mu_);  // in order
};

}  // namespace mc::master
