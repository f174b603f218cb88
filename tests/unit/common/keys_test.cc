// The keys' rule (common/keys.h): 1..kMaxKeyBytes bytes of anything, one message for a breach.
#include "common/keys.h"

#include <string>

#include "common/status.h"
#include "gtest/gtest.h"

namespace mc {
namespace {

TEST(Keys, OneToTheLimitOfAnyBytesAreKeys) {
  EXPECT_TRUE(ValidateKey("k").ok());
  EXPECT_TRUE(ValidateKey(std::string(kMaxKeyBytes, 'k')).ok());
  EXPECT_TRUE(ValidateKey(std::string("\0\xff\n", 3)).ok()) << "binary keys are keys";
}

TEST(Keys, AnEmptyOrTooLongKeyIsInvalidWithOneMessage) {
  absl::Status empty = ValidateKey("");
  EXPECT_EQ(ToCode(empty), Code::kInvalidArgument);
  EXPECT_EQ(empty.message(), "empty key");
  absl::Status long_key = ValidateKey(std::string(kMaxKeyBytes + 1, 'k'));
  EXPECT_EQ(ToCode(long_key), Code::kInvalidArgument);
  EXPECT_EQ(long_key.message(), "key of 4097 bytes exceeds the limit of 4096");
}

}  // namespace
}  // namespace mc
