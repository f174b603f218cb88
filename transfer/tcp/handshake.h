// The data-plane connection handshake: a mutual HMAC challenge-response over the cluster
// secret's kDataPlane key, the first exchange on every data-plane connection when the cluster
// runs with authentication (docs/security.md).
//
//   1. requester -> server  AUTH offset=0, payload Nc (32 random bytes)
//   2. server -> requester  AUTH response OK, payload Ns (32 random bytes) || MACs
//                           MACs = HMAC(kDataPlane, "mcstore/v1/dp-server\n" || Nc || Ns)
//   3. requester -> server  AUTH offset=1, payload MACc
//                           MACc = HMAC(kDataPlane, "mcstore/v1/dp-client\n" || Nc || Ns)
//   4. server -> requester  AUTH response OK (no payload), or PERMISSION_DENIED and a close
//
// Each side proves the key over both fresh nonces and its role, so a transcript can neither be
// replayed nor reflected.
//
// Encryption (sealed_records.h): step 1's segment_id carries the requester's wish (0 plaintext,
// 1 encrypted); step 2's response echoes the server's answer, the same value (a server that
// requires encryption refuses a plaintext wish with PERMISSION_DENIED in step 2; one that does
// not require it follows the wish). When encrypted, both MAC transcripts end with one byte 0x01
// (so a man in the middle cannot flip the wish or the answer without failing a MAC), and both
// sides derive the connection's keys from
//   base = HMAC(kDataPlane, "mcstore/v1/dp-session\n" || Nc || Ns)
// under the secret the SERVER signed its proof with (the requester finds which of its secrets
// that is, so a rotation with several secrets keeps working), expanded by DeriveSessionKeys.
// Every byte after step 4 is then in sealed records. A server of an older version (which only
// knows wish 0) refuses a wish of 1 as malformed; an older requester's wish is 0. The whole
// exchange is bounded by one deadline (no slow-drip peer holds a server thread past it). A MAC is
// made under the signing secret and accepted under any, so rotation works as for the other
// purposes. Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/auth.h"
#include "transfer/tcp/sealed_records.h"

namespace mc::transfer::tcp {

inline constexpr size_t kHandshakeNonceSize = 32;

// Why a server-side handshake failed (the `reason` label of mc_data_auth_failures_total).
enum class HandshakeFailure {
  kNone = 0,
  kNoHandshake,  // the first frame was not AUTH (e.g. a raw READ)
  kMalformed,    // an AUTH frame of the wrong step or size, or undecodable bytes
  kBadMac,       // the requester's proof did not verify
  kTimeout,      // not finished by the deadline
  kClosed,       // the peer went away or an I/O error
  kPlaintext,    // a plaintext wish to a server that requires encryption (--data_encryption=on)
  kCount,
};
std::string_view HandshakeFailureName(HandshakeFailure failure);

// The requester's side on connected socket `fd` (blocking or not), by `deadline_ms` (steady ms).
// kPermissionDenied when the server's proof fails or it refuses ours; kTransferFailed on I/O.
// With `session` non-null the requester asks for encryption and, on success, *session holds
// the connection's keys (a server that answers plaintext fails the handshake); null: plaintext.
absl::Status ClientHandshake(int fd, const auth::ClusterKeys& keys, int64_t deadline_ms,
                             SessionKeys* session = nullptr);

// The server's side: reads the first frame from `fd` and runs the exchange. kNone on success;
// otherwise the connection must be closed. `detail` says what happened, for logs. With
// `require_encryption` a plaintext wish is refused (kPlaintext). On success *encrypted says
// whether the connection continues in sealed records, then with *session's keys.
HandshakeFailure ServerHandshake(int fd, const auth::ClusterKeys& keys, int64_t deadline_ms,
                                 std::string* detail, bool require_encryption = false,
                                 bool* encrypted = nullptr, SessionKeys* session = nullptr);

// Exact send/receive on `fd` bounded by `deadline_ms` (steady ms), for blocking or non-blocking
// sockets: kTransferFailed "deadline" when it passes, kUnavailable on EOF.
absl::Status SendAllBy(int fd, const void* data, size_t length, int64_t deadline_ms);
absl::Status RecvAllBy(int fd, void* data, size_t length, int64_t deadline_ms);

}  // namespace mc::transfer::tcp
