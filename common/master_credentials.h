// The credentials of master RPCs, as gRPC metadata (docs/security.md): what mc-client,
// mc-admin and the benchmarks attach and what mc-master parses. Verification with its replay
// cache and the session table live in the master (master/rpc_auth.h, master/client_registry.h);
// this file only holds the wire format, so that every caller builds it the same way.
//
//   x-mc-auth: v2 <role> <id> <unix_ms> <nonce_hex> <run_hex> <mac_hex>
//     A proof that the caller holds the cluster secret: role is "register" (RegisterClient; id is
//     the client id) or "admin" (GetStatus; id names the tool). nonce: 16 random bytes; run: the
//     16-byte run id the master answered to Hello (a proof is good for that master run only:
//     its replay cache lives in memory, so a proof of an earlier run would pass it again after a
//     restart); mac: the full HMAC-SHA256 under the kMasterRpc key of ProofMessage(...), which
//     also binds the registering client's data endpoint (a captured proof cannot point puts
//     elsewhere). Version 1 (no run id) is refused.
//   x-mc-auth: v3 member <client_id> <serial> <unix_ms> <nonce_hex> <run_hex> <mac_hex>
//     A member's registration proof (a member credential, `mc-admin issue-member`): as a v2
//     register proof, but MACed under the kMasterRpc key derived from the member key of
//     (client_id, serial), which the master derives from the secret; the message names version
//     3, the role, the id and the serial. Only RegisterClient takes it, and only for that id;
//     "member" is no v2 role and "register"/"admin" no v3 role, so neither form passes as the
//     other (a member proof is never an admin proof).
//   x-mc-session: <client_id> <token_hex>
//     Every other call of a registered client: the 128-bit token its registration answered.
//
// Ids are 1..128 printable ASCII characters without spaces. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/auth.h"

namespace mc::auth {

inline constexpr char kProofHeader[] = "x-mc-auth";
inline constexpr char kSessionHeader[] = "x-mc-session";
// Trailing metadata of a standby master's UNAVAILABLE answer: the leader's HOST:PORT (not a
// credential; here because every caller of the master reads it the same way).
inline constexpr char kLeaderHeader[] = "x-mc-leader";
inline constexpr size_t kSessionTokenSize = 16;
inline constexpr size_t kNonceSize = 16;
inline constexpr size_t kRunIdSize = 16;
inline constexpr size_t kMaxCallerIdSize = 128;
// Longer metadata values are refused before they are parsed.
inline constexpr size_t kMaxCredentialSize = 512;

enum class ProofRole { kRegister, kAdmin, kMember };
std::string_view ProofRoleName(ProofRole role);

struct ParsedProof {
  ProofRole role = ProofRole::kRegister;
  std::string id;
  uint64_t serial = 0;  // kMember: the member credential's serial
  int64_t unix_ms = 0;
  std::string nonce_hex;  // 2 * kNonceSize lower-case hex digits
  std::string run_id;     // kRunIdSize raw bytes
  std::string mac;        // kMacSize raw bytes
};

struct SessionCredential {
  std::string client_id;
  std::string token;  // kSessionTokenSize raw bytes
};

// The string the proof's MAC covers (`serial`: kMember only).
std::string ProofMessage(ProofRole role, std::string_view id, std::string_view endpoint,
                         int64_t unix_ms, std::string_view nonce_hex, std::string_view run_id,
                         uint64_t serial = 0);
// A fresh proof (random nonce, the given time) for the master run `run_id` (kRunIdSize bytes, as
// HelloResponse.run_id) as the x-mc-auth value. With keys loaded from a member credential
// (keys.member() set), a kRegister proof is a v3 member proof for the CREDENTIAL's client id and
// serial, whatever `id` says: the master refuses it for any other registering id.
std::string MakeProof(const ClusterKeys& keys, ProofRole role, std::string_view id,
                      std::string_view endpoint, int64_t unix_ms, std::string_view run_id);
// INVALID_ARGUMENT naming what is wrong (field count, version, role, id, time, hex).
absl::StatusOr<ParsedProof> ParseProof(std::string_view value);

std::string MakeSessionCredential(std::string_view client_id, std::string_view token);
absl::StatusOr<SessionCredential> ParseSessionCredential(std::string_view value);

// 1..kMaxCallerIdSize characters in '!'..'~'.
bool ValidCallerId(std::string_view id);
// Exactly 2 * `bytes` hex digits (either case) -> the bytes.
absl::StatusOr<std::string> FromHex(std::string_view hex, size_t bytes);
// Milliseconds since the Unix epoch (system clock).
int64_t UnixNowMs();

}  // namespace mc::auth
