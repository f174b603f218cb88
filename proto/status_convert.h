// The one place that converts between absl::Status, grpc::Status and the wire Code enum.
// Thread-safe: pure functions.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "common/status.h"
#include "mcstore/v1/store.pb.h"

namespace mc {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

inline mcstore::v1::Code ToProtoCode(Code code) { return static_cast<mcstore::v1::Code>(code); }
inline Code FromProtoCode(int code) { return CodeFromInt(code); }

// Fills a wire Result from a status.
void SetResult(const absl::Status& status, mcstore::v1::Result* result);
// The status a wire Result stands for.
absl::Status FromResult(const mcstore::v1::Result& result);

}  // namespace mc
