#include "master/rpc_auth.h"

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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
    case AuthFailure::kRevoked:
      return "revoked";
    case AuthFailure::kRevocationUnreadable:
      return "revocation_unreadable";
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
  if (!options_.revoked_members_file.empty()) {
    absl::MutexLock lock(&members_mu_);
    ReloadRevocationsLocked();  // logs the list (or why it cannot be read) at start
  }
}

int64_t RpcAuthenticator::NowMs() const {
  return options_.unix_now_ms ? options_.unix_now_ms() : auth::UnixNowMs();
}

absl::Status RpcAuthenticator::CheckProof(std::string_view value, auth::ProofRole role,
                                          std::string_view id, std::string_view endpoint,
                                          AuthFailure* reason, Caller* caller) {
  absl::StatusOr<auth::ParsedProof> proof = auth::ParseProof(value);
  if (!proof.ok()) {
    *reason = AuthFailure::kMalformed;
    return absl::UnauthenticatedError(
        absl::StrCat("malformed x-mc-auth: ", proof.status().message()));
  }
  // A registration takes a member proof too; nothing else does (a member proof is never an
  // admin proof).
  const bool member = proof->role == auth::ProofRole::kMember && role == auth::ProofRole::kRegister;
  if (proof->role != role && !member) {
    *reason = AuthFailure::kWrongRole;
    return absl::UnauthenticatedError("x-mc-auth has the wrong role for this call");
  }
  if (proof->id != id) {
    *reason = AuthFailure::kWrongClient;
    return absl::UnauthenticatedError(
        member ? absl::StrCat("the member credential is for client ", proof->id,
                              ", not for the registering client ", std::string(id))
               : std::string("x-mc-auth names another id than the request"));
  }
  auth::ClusterKeysPtr wrap_keys;
  if (member) {
    wrap_keys = VerifyMember(*proof, endpoint);
    if (wrap_keys == nullptr) {
      *reason = AuthFailure::kBadMac;
      return absl::UnauthenticatedError(absl::StrCat(
          "member proof for ", proof->id, " serial ", proof->serial,
          " does not verify: its credential was not issued with this cluster's secret for this "
          "id and serial (compare the fingerprints in the daemons' start-up logs)"));
    }
    switch (CheckRevoked(proof->id, proof->serial)) {
      case Revocation::kValid:
        break;
      case Revocation::kRevoked:
        *reason = AuthFailure::kRevoked;
        return absl::PermissionDeniedError(absl::StrCat(
            "member credential of ", proof->id, " serial ", proof->serial,
            " is revoked (--revoked_members_file); issue a new serial with mc-admin issue-member"));
      case Revocation::kUnreadable:
        *reason = AuthFailure::kRevocationUnreadable;
        return absl::UnavailableError(
            "the master cannot read its --revoked_members_file: member registrations are refused "
            "until it can (see the master's log)");
    }
  } else {
    const std::string message =
        auth::ProofMessage(role, id, endpoint, proof->unix_ms, proof->nonce_hex, proof->run_id);
    if (!keys_->Verify(auth::Purpose::kMasterRpc, message,
                       reinterpret_cast<const uint8_t*>(proof->mac.data()), proof->mac.size())) {
      *reason = AuthFailure::kBadMac;
      return absl::UnauthenticatedError(
          "x-mc-auth does not verify: not signed with this cluster's secret (compare the "
          "fingerprints in the daemons' start-up logs)");
    }
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
  if (caller != nullptr) {
    caller->member = member;
    caller->member_serial = member ? proof->serial : 0;
    caller->wrap_keys = std::move(wrap_keys);
  }
  return absl::OkStatus();
}

auth::ClusterKeysPtr RpcAuthenticator::VerifyMember(const auth::ParsedProof& proof,
                                                    std::string_view endpoint) const {
  const std::string message =
      auth::ProofMessage(auth::ProofRole::kMember, proof.id, endpoint, proof.unix_ms,
                         proof.nonce_hex, proof.run_id, proof.serial);
  auth::ClusterKeysPtr found;
  // Every secret is tried (no early exit), as ClusterKeys::Verify does.
  for (size_t s = 0; s < keys_->secret_count(); ++s) {
    if (!keys_->Has(s, auth::Purpose::kMember)) continue;
    auth::PurposeKeys set =
        auth::MemberPurposeKeys(auth::MemberKey(*keys_, s, proof.id, proof.serial));
    // Only to satisfy FromPurposeKeys (and the fingerprint); never used to sign here.
    set[static_cast<int>(auth::Purpose::kDataPlane)] =
        keys_->PurposeKey(s, auth::Purpose::kDataPlane);
    absl::StatusOr<auth::ClusterKeysPtr> keys =
        auth::ClusterKeys::FromPurposeKeys({set}, auth::MemberIdentity{proof.id, proof.serial});
    if (!keys.ok()) continue;
    if ((*keys)->Verify(auth::Purpose::kMasterRpc, message,
                        reinterpret_cast<const uint8_t*>(proof.mac.data()), proof.mac.size()) &&
        found == nullptr) {
      found = *std::move(keys);
    }
  }
  return found;
}

RpcAuthenticator::Revocation RpcAuthenticator::CheckRevoked(const std::string& client_id,
                                                            uint64_t serial) {
  absl::MutexLock lock(&members_mu_);
  ReloadRevocationsLocked();
  return RevokedLocked(client_id, serial);
}

RpcAuthenticator::Revocation RpcAuthenticator::RevokedLocked(const std::string& client_id,
                                                             uint64_t serial) const {
  if (revocations_unreadable_) return Revocation::kUnreadable;
  if (revoked_all_.contains(client_id)) return Revocation::kRevoked;
  auto it = revoked_.find(client_id);
  return it != revoked_.end() && it->second.contains(serial) ? Revocation::kRevoked
                                                             : Revocation::kValid;
}

void RpcAuthenticator::RevocationsUnreadableLocked(const std::string& why) {
  if (!revocations_unreadable_) {
    Logger("master").error(
        "--revoked_members_file {}: {}; every member registration is refused until it reads",
        options_.revoked_members_file, why);
  }
  revocations_unreadable_ = true;
  revocations_stamp_.clear();  // read again next time
}

void RpcAuthenticator::ReloadRevocationsLocked() {
  const std::string& path = options_.revoked_members_file;
  if (path.empty()) return;
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return RevocationsUnreadableLocked(std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return RevocationsUnreadableLocked("not a regular file");
  const std::string stamp =
      absl::StrCat(st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
  if (stamp == revocations_stamp_) return;
  std::ifstream in(path);
  if (!in) return RevocationsUnreadableLocked(std::strerror(errno));
  absl::flat_hash_map<std::string, absl::flat_hash_set<uint64_t>> revoked;
  absl::flat_hash_set<std::string> revoked_all;
  std::string line;
  int line_no = 0;
  size_t entries = 0;
  while (std::getline(in, line)) {
    ++line_no;
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    if (f.empty() || f[0][0] == '#') continue;
    uint64_t serial = 0;
    if (f.size() != 2 || !auth::ValidCallerId(f[0]) ||
        (f[1] != "*" && (f[1].find_first_not_of("0123456789") != std::string::npos ||
                         !absl::SimpleAtoi(f[1], &serial)))) {
      return RevocationsUnreadableLocked(
          absl::StrCat("line ", line_no, " is not `CLIENT_ID SERIAL` or `CLIENT_ID *`"));
    }
    if (f[1] == "*") {
      revoked_all.insert(f[0]);
    } else {
      revoked[f[0]].insert(serial);
    }
    ++entries;
  }
  if (in.bad()) return RevocationsUnreadableLocked(std::strerror(errno));
  revoked_ = std::move(revoked);
  revoked_all_ = std::move(revoked_all);
  revocations_stamp_ = stamp;
  revocations_unreadable_ = false;
  Logger("master").info("--revoked_members_file {}: {} revocation(s)", path, entries);
}

void RpcAuthenticator::NoteRegistration(const std::string& client_id, uint64_t session, bool member,
                                        uint64_t serial) {
  absl::MutexLock lock(&members_mu_);
  if (member) {
    member_sessions_[client_id] = MemberSession{session, serial};
  } else {
    member_sessions_.erase(client_id);
  }
}

std::vector<RpcAuthenticator::RevokedSession> RpcAuthenticator::TakeRevokedSessions() {
  std::vector<RevokedSession> out;
  absl::MutexLock lock(&members_mu_);
  if (options_.revoked_members_file.empty()) return out;
  ReloadRevocationsLocked();
  if (revocations_unreadable_) return out;
  for (auto it = member_sessions_.begin(); it != member_sessions_.end();) {
    if (RevokedLocked(it->first, it->second.serial) == Revocation::kRevoked) {
      out.push_back(RevokedSession{it->first, it->second.session, it->second.serial});
      member_sessions_.erase(it++);
    } else {
      ++it;
    }
  }
  return out;
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
