#include "common/status.h"

#include <gtest/gtest.h>

#include "proto/status_convert.h"

namespace mc {
namespace {

TEST(Status, McErrorCarriesExactCode) {
  for (int c = 1; c <= kMaxCode; ++c) {
    absl::Status s = McError(static_cast<Code>(c), "boom");
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(ToCode(s), static_cast<Code>(c)) << CodeName(static_cast<Code>(c));
    EXPECT_EQ(s.message(), "boom");
  }
  EXPECT_TRUE(McError(Code::kOk, "x").ok());
}

TEST(Status, PlainAbslStatusMapsToNearestCode) {
  EXPECT_EQ(ToCode(absl::NotFoundError("x")), Code::kNotFound);
  EXPECT_EQ(ToCode(absl::InvalidArgumentError("x")), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(absl::UnknownError("x")), Code::kInternal);
  EXPECT_EQ(ToCode(absl::OkStatus()), Code::kOk);
}

TEST(Status, UnknownWireCodeBecomesInternal) {
  EXPECT_EQ(CodeFromInt(-1), Code::kInternal);
  EXPECT_EQ(CodeFromInt(99), Code::kInternal);
  EXPECT_EQ(CodeFromInt(11), Code::kHasLease);
}

TEST(Status, ResultRoundTrip) {
  mcstore::v1::Result r;
  SetResult(McError(Code::kHasLease, "leased"), &r);
  EXPECT_EQ(r.code(), mcstore::v1::HAS_LEASE);
  EXPECT_EQ(ToCode(FromResult(r)), Code::kHasLease);
}

TEST(Status, GrpcRoundTripKeepsCanonicalCode) {
  grpc::Status g = ToGrpcStatus(absl::InvalidArgumentError("bad"));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ToCode(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "down"))),
            Code::kUnavailable);
}

}  // namespace
}  // namespace mc
