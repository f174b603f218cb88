#include "proto/status_convert.h"

#include <string>

namespace mc {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  auto code = static_cast<absl::StatusCode>(status.error_code());
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return McError(Code::kUnavailable, "rpc: " + status.error_message());
  }
  return absl::Status(code, "rpc: " + status.error_message());
}

void SetResult(const absl::Status& status, mcstore::v1::Result* result) {
  result->set_code(ToProtoCode(ToCode(status)));
  result->set_message(std::string(status.message()));
}

absl::Status FromResult(const mcstore::v1::Result& result) {
  return McError(FromProtoCode(result.code()), result.message());
}

}  // namespace mc
