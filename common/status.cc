#include "common/status.h"

#include <string>

#include "absl/strings/cord.h"

namespace mc {
namespace {

constexpr absl::string_view kPayloadUrl = "type.mcstore/code";
constexpr absl::string_view kUnreachableUrl = "type.mcstore/peer-unreachable";

absl::StatusCode Canonical(Code code) {
  switch (code) {
    case Code::kOk:
      return absl::StatusCode::kOk;
    case Code::kNotFound:
      return absl::StatusCode::kNotFound;
    case Code::kAlreadyExists:
      return absl::StatusCode::kAlreadyExists;
    case Code::kNoSpace:
      return absl::StatusCode::kResourceExhausted;
    case Code::kInvalidArgument:
      return absl::StatusCode::kInvalidArgument;
    case Code::kNotReady:
      return absl::StatusCode::kFailedPrecondition;
    case Code::kSizeMismatch:
      return absl::StatusCode::kOutOfRange;
    case Code::kChecksumMismatch:
      return absl::StatusCode::kDataLoss;
    case Code::kLeaseExpired:
      return absl::StatusCode::kDeadlineExceeded;
    case Code::kTransferFailed:
      return absl::StatusCode::kAborted;
    case Code::kUnavailable:
      return absl::StatusCode::kUnavailable;
    case Code::kHasLease:
      return absl::StatusCode::kFailedPrecondition;
    case Code::kInternal:
      return absl::StatusCode::kInternal;
    case Code::kPermissionDenied:
      return absl::StatusCode::kPermissionDenied;
  }
  return absl::StatusCode::kInternal;
}

}  // namespace

std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "OK";
    case Code::kNotFound:
      return "NOT_FOUND";
    case Code::kAlreadyExists:
      return "ALREADY_EXISTS";
    case Code::kNoSpace:
      return "NO_SPACE";
    case Code::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case Code::kNotReady:
      return "NOT_READY";
    case Code::kSizeMismatch:
      return "SIZE_MISMATCH";
    case Code::kChecksumMismatch:
      return "CHECKSUM_MISMATCH";
    case Code::kLeaseExpired:
      return "LEASE_EXPIRED";
    case Code::kTransferFailed:
      return "TRANSFER_FAILED";
    case Code::kUnavailable:
      return "UNAVAILABLE";
    case Code::kHasLease:
      return "HAS_LEASE";
    case Code::kInternal:
      return "INTERNAL";
    case Code::kPermissionDenied:
      return "PERMISSION_DENIED";
  }
  return "INTERNAL";
}

Code CodeFromInt(int value) {
  if (value < 0 || value > kMaxCode) return Code::kInternal;
  return static_cast<Code>(value);
}

absl::Status McError(Code code, std::string_view message) {
  if (code == Code::kOk) return absl::OkStatus();
  absl::Status status(Canonical(code), absl::string_view(message.data(), message.size()));
  status.SetPayload(kPayloadUrl, absl::Cord(std::to_string(static_cast<int>(code))));
  return status;
}

Code ToCode(const absl::Status& status) {
  if (status.ok()) return Code::kOk;
  if (auto payload = status.GetPayload(kPayloadUrl)) {
    int value = -1;
    std::string text(*payload);
    if (!text.empty() && text.size() < 4) {
      value = 0;
      for (char c : text) value = value * 10 + (c - '0');
    }
    return CodeFromInt(value);
  }
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
      return Code::kNotFound;
    case absl::StatusCode::kAlreadyExists:
      return Code::kAlreadyExists;
    case absl::StatusCode::kResourceExhausted:
      return Code::kNoSpace;
    case absl::StatusCode::kInvalidArgument:
      return Code::kInvalidArgument;
    case absl::StatusCode::kFailedPrecondition:
      return Code::kNotReady;
    case absl::StatusCode::kOutOfRange:
      return Code::kSizeMismatch;
    case absl::StatusCode::kDataLoss:
      return Code::kChecksumMismatch;
    case absl::StatusCode::kDeadlineExceeded:
      return Code::kLeaseExpired;
    case absl::StatusCode::kAborted:
      return Code::kTransferFailed;
    case absl::StatusCode::kUnavailable:
      return Code::kUnavailable;
    default:
      return Code::kInternal;
  }
}

absl::Status MarkPeerUnreachable(absl::Status status) {
  if (!status.ok()) status.SetPayload(kUnreachableUrl, absl::Cord("1"));
  return status;
}

bool IsPeerUnreachable(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kUnreachableUrl).has_value();
}

absl::Status WithPeerUnreachableOf(absl::Status status, const absl::Status& cause) {
  return IsPeerUnreachable(cause) ? MarkPeerUnreachable(std::move(status)) : status;
}

}  // namespace mc
