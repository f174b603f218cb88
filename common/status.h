// Per-key result codes and their carriage inside absl::Status.
//
// Every fallible function returns absl::Status / absl::StatusOr. Our wire contract has a finer
// per-key vocabulary (mcstore.v1.Code) than absl's canonical codes; an error made with McError()
// carries its exact Code as a payload, and ToCode() recovers it (falling back to a mapping of the
// canonical code). The conversions to and from gRPC live in proto/status_convert.h.
// Thread-safe: all functions are pure.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"

namespace mc {

// Values equal mcstore.v1.Code on the wire.
enum class Code : int {
  kOk = 0,
  kNotFound = 1,
  kAlreadyExists = 2,
  kNoSpace = 3,
  kInvalidArgument = 4,
  kNotReady = 5,
  kSizeMismatch = 6,
  kChecksumMismatch = 7,
  kLeaseExpired = 8,
  kTransferFailed = 9,
  kUnavailable = 10,
  kHasLease = 11,
  kInternal = 12,
  kPermissionDenied = 13,  // the data plane refused a frame: no valid grant for it
};
inline constexpr int kMaxCode = 13;

// "OK", "NOT_FOUND", ... as in the proto enum.
std::string_view CodeName(Code code);

// An absl::Status whose canonical code approximates `code` and whose payload carries it exactly.
absl::Status McError(Code code, std::string_view message);

// The per-key Code of a status (kOk for OK).
Code ToCode(const absl::Status& status);

// Range-checks a wire integer; unknown values become kInternal.
Code CodeFromInt(int value);

// A transfer error that means the peer is certainly not serving (it refused the connection:
// nothing listens at its data endpoint any more), as opposed to a slow or failed exchange. The
// batch paths back off from such a holder and report it (master.proto ReportReplicaFaults).
// MarkPeerUnreachable keeps the status's code and message and adds the mark (a payload), which
// survives copies and WithPeerUnreachableOf.
absl::Status MarkPeerUnreachable(absl::Status status);
bool IsPeerUnreachable(const absl::Status& status);
// `status` with the mark of `cause`, if it has one.
absl::Status WithPeerUnreachableOf(absl::Status status, const absl::Status& cause);

}  // namespace mc
