// RpcAuthenticator: who is calling the Master service (docs/security.md).
//
// Checks the registration and admin proofs of common/master_credentials.h: the MAC under the
// cluster keys (any secret of a rotation verifies), that the proof names this master run (a
// random run id drawn here at start and answered to Hello: the replay cache below is in memory,
// so a proof of an earlier run, or made for another master, would otherwise pass it again), the
// proof's time against this host's clock (within max_clock_skew_ms either way) and that its
// nonce was not seen before (a bounded replay cache that remembers each nonce for twice the
// skew window, so a proof cannot be used twice).
// A member proof (v3, a member credential: docs/security.md) is MACed under the key derived from
// the member key of its (client id, serial), which this class derives from each secret; it is
// refused for any other registering id, and when the revocation list (--revoked_members_file,
// re-read when its mtime changes; unreadable = every member proof refused) names it. The live
// sessions of members registered so are remembered, so that the maintenance pass can end those
// revoked later (TakeRevokedSessions).
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
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
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
  // kRegistrant with a member credential: its serial, and the keys its owner key is wrapped
  // under (derived from its member key; null: the cluster keys, a cluster-secret registration).
  bool member = false;
  uint64_t member_serial = 0;
  auth::ClusterKeysPtr wrap_keys;
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
  kRevoked,          // a member credential the revocation list names
  kRevocationUnreadable,  // the revocation list cannot be read: member proofs refused
  kCount,
};
std::string_view AuthFailureName(AuthFailure reason);

struct RpcAuthOptions {
  int64_t max_clock_skew_ms = 60'000;     // a proof's time may differ this much from ours
  size_t replay_cache_entries = 100'000;  // nonces remembered at most (2 * skew each)
  // Each line `CLIENT_ID SERIAL` or `CLIENT_ID *` revokes member credentials; empty: none.
  std::string revoked_members_file;
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
  // `role` kRegister also takes a member proof (v3) for `id`; then `caller` (optional) gets
  // member, member_serial and wrap_keys.
  absl::Status CheckProof(std::string_view value, auth::ProofRole role, std::string_view id,
                          std::string_view endpoint, AuthFailure* reason, Caller* caller = nullptr);

  // A registration succeeded as `session` (member: with a member credential): remembered, so
  // that a later revocation of its credential ends it. A cluster-secret registration of the same
  // id forgets the member one.
  void NoteRegistration(const std::string& client_id, uint64_t session, bool member,
                        uint64_t serial) ABSL_LOCKS_EXCLUDED(members_mu_);
  struct RevokedSession {
    std::string client_id;
    uint64_t session = 0;
    uint64_t serial = 0;
  };
  // The remembered member sessions whose credential the revocation list (re-read if changed)
  // now names; forgotten here. None while the list is unreadable.
  std::vector<RevokedSession> TakeRevokedSessions() ABSL_LOCKS_EXCLUDED(members_mu_);

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

  // Verifies a member proof: the MAC under each secret's member key of (id, serial); on success
  // the keys derived under the secret that verified (to wrap the owner key).
  auth::ClusterKeysPtr VerifyMember(const auth::ParsedProof& proof,
                                    std::string_view endpoint) const;
  enum class Revocation { kValid, kRevoked, kUnreadable };
  // Re-reads the list when its file changed. Takes members_mu_.
  Revocation CheckRevoked(const std::string& client_id, uint64_t serial)
      ABSL_LOCKS_EXCLUDED(members_mu_);
  void ReloadRevocationsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(members_mu_);
  // The list cannot be read or parsed (`why`): member registrations refused, logged once.
  void RevocationsUnreadableLocked(const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(members_mu_);
  Revocation RevokedLocked(const std::string& client_id, uint64_t serial) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(members_mu_);

  const auth::ClusterKeysPtr keys_;
  const RpcAuthOptions options_;
  const std::string run_id_;
  Counter* failures_[static_cast<int>(AuthFailure::kCount)];
  absl::Mutex mu_;
  absl::flat_hash_set<std::string> nonces_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<int64_t, std::string>> nonce_expiry_ ABSL_GUARDED_BY(mu_);  // in order

  absl::Mutex members_mu_;
  // The revocation list as last read: id -> revoked serials, and the ids revoked whole (`X *`).
  absl::flat_hash_map<std::string, absl::flat_hash_set<uint64_t>> revoked_
      ABSL_GUARDED_BY(members_mu_);
  absl::flat_hash_set<std::string> revoked_all_ ABSL_GUARDED_BY(members_mu_);
  bool revocations_unreadable_ ABSL_GUARDED_BY(members_mu_) = false;
  std::string revocations_stamp_ ABSL_GUARDED_BY(members_mu_);  // inode, size, mtime last read
  struct MemberSession {
    uint64_t session = 0;
    uint64_t serial = 0;
  };
  absl::flat_hash_map<std::string, MemberSession> member_sessions_ ABSL_GUARDED_BY(members_mu_);
};

}  // namespace mc::master
