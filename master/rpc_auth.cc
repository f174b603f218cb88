#include "master/rpc_auth.h"

#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mc::master {

std::string_view AuthFailureName(AuthFailure reason) {
  switch (reason) {
    case AuthFailure::kMissing:
      return "missing";
    case AuthFailure::kMalformed:
      return "malformed";
    case AuthFailure::kBadMac:
      return "bad_mac";
    case AuthFailure::kStale:
      return "stale";
    case AuthFailure::kReplay:
      return "replay";
    case AuthFailure::kReplayCacheFull:
      return "replay_cache_full";
    case AuthFailure::kUnknownSession:
      return "unknown_session";
    case AuthFailure::kWrongClient:
      return "wrong_client";
    case AuthFailure::kWrongRole:
      return "wrong_role";
    case AuthFailure::kOtherRun:
      return "other_run";
    case AuthFailure::kCount:
      break;
  }
  return "invalid";
}

RpcAuthenticator::RpcAuthenticator(auth::ClusterKeysPtr keys, RpcAuthOptions options,
                                   MetricsRegistry& metrics)
    : keys_(std::move(keys)),
      options_(std::move(options)),
      run_id_(auth::RandomBytes(auth::kRunIdSize)) {
  for (int r = 0; r < static_cast<int>(AuthFailure::kCount); ++r) {
    failures_[r] = &metrics.GetCounter(
        "mc_master_auth_failures_total",
        "Master RPCs refused for their credentials (answered UNAUTHENTICATED or "
        "PERMISSION_DENIED), by reason",
        {{"reason", std::string(AuthFailureName(static_cast<AuthFailure>(r)))}});
  }
}

int64_t RpcAuthenticator::NowMs() const {
  return options_.unix_now_ms ? options_.unix_now_ms() : auth::UnixNowMs();
}

absl::Status RpcAuthenticator::CheckProof(std::string_view value, auth::ProofRole role,
                                          std::string_view id, std::string_view endpoint,
                                          AuthFailure* reason) {
  absl::StatusOr<auth::ParsedProof> proof = auth::ParseProof(value);
  if (!proof.ok()) {
    *reason = AuthFailure::kMalformed;
    return absl::UnauthenticatedError(
        absl::StrCat("malformed x-mc-auth: ", proof.status().message()));
  }
  if (proof->role != role) {
    *reason = AuthFailure::kWrongRole;
    return absl::UnauthenticatedError("x-mc-auth has the wrong role for this call");
  }
  if (proof->id != id) {
    *reason = AuthFailure::kWrongClient;
    return absl::UnauthenticatedError("x-mc-auth names another id than the request");
  }
  const std::string message =
      auth::ProofMessage(role, id, endpoint, proof->unix_ms, proof->nonce_hex, proof->run_id);
  if (!keys_->Verify(auth::Purpose::kMasterRpc, message,
                     reinterpret_cast<const uint8_t*>(proof->mac.data()), proof->mac.size())) {
    *reason = AuthFailure::kBadMac;
    return absl::UnauthenticatedError(
        "x-mc-auth does not verify: not signed with this cluster's secret (compare the "
        "fingerprints in the daemons' start-up logs)");
  }
  if (proof->run_id != run_id_) {
    *reason = AuthFailure::kOtherRun;
    return absl::UnauthenticatedError(
        "x-mc-auth was made for another master run (a restart or another master): ask Hello "
        "for this run's id and prove again");
  }
  const int64_t now = NowMs();
  if (proof->unix_ms < now - options_.max_clock_skew_ms ||
      proof->unix_ms > now + options_.max_clock_skew_ms) {
    *reason = AuthFailure::kStale;
    return absl::UnauthenticatedError(absl::StrCat(
        "x-mc-auth is ", proof->unix_ms - now, " ms off this master's clock (allowed: +-",
        options_.max_clock_skew_ms, " ms); check NTP on both hosts"));
  }
  if (!RememberNonce(proof->nonce_hex, now, reason)) {
    return absl::UnauthenticatedError(*reason == AuthFailure::kReplay
                                          ? "x-mc-auth was used before (replay)"
                                          : "too many proofs in the window; retry later");
  }
  return absl::OkStatus();
}

bool RpcAuthenticator::RememberNonce(const std::string& nonce_hex, int64_t now_ms,
                                     AuthFailure* reason) {
  absl::MutexLock lock(&mu_);
  // A proof is good for +-skew around its time, so its nonce must be remembered until
  // (its time + skew) <= (now at acceptance + 2 * skew).
  while (!nonce_expiry_.empty() && nonce_expiry_.front().first <= now_ms) {
    nonces_.erase(nonce_expiry_.front().second);
    nonce_expiry_.pop_front();
  }
  if (nonces_.contains(nonce_hex)) {
    *reason = AuthFailure::kReplay;
    return false;
  }
  if (nonces_.size() >= options_.replay_cache_entries) {
    *reason = AuthFailure::kReplayCacheFull;
    return false;
  }
  nonces_.insert(nonce_hex);
  nonce_expiry_.emplace_back(now_ms + 2 * options_.max_clock_skew_ms, nonce_hex);
  return true;
}

void RpcAuthenticator::CountFailure(std::string_view rpc, AuthFailure reason,
                                    std::string_view detail) {
  failures_[static_cast<int>(reason)]->Inc();
  MC_LOG_EVERY(std::chrono::seconds(5), Logger("master"), warn, "{} refused ({}): {}", rpc,
               AuthFailureName(reason), detail);
}

uint64_t RpcAuthenticator::Failures(AuthFailure reason) const {
  return failures_[static_cast<int>(reason)]->Value();
}

size_t RpcAuthenticator::ReplayCacheSizeForTest() {
  absl::MutexLock lock(&mu_);
  return nonces_.size();
}

}  // namespace mc::master
