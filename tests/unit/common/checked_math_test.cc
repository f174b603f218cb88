// Checked size arithmetic: overflow is reported, never wrapped.
#include "common/checked_math.h"

#include <limits>

#include "common/status.h"
#include "gtest/gtest.h"

namespace mc {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

TEST(CheckedMath, AddAndMul) {
  uint64_t out = 7;
  EXPECT_TRUE(CheckedAdd(1, 2, &out));
  EXPECT_EQ(out, 3u);
  EXPECT_FALSE(CheckedAdd(kMax, 1, &out));
  EXPECT_EQ(out, 3u) << "untouched on overflow";
  EXPECT_TRUE(CheckedMul(1ull << 31, 1ull << 32, &out));
  EXPECT_EQ(out, 1ull << 63);
  EXPECT_FALSE(CheckedMul(1ull << 32, 1ull << 32, &out));
  EXPECT_EQ(SaturatingAdd(kMax - 1, 5), kMax);
  EXPECT_EQ(SaturatingAdd(2, 5), 7u);
}

TEST(CheckedMath, RangeWithin) {
  EXPECT_TRUE(RangeWithin(0, 10, 10));
  EXPECT_TRUE(RangeWithin(10, 0, 10));
  EXPECT_FALSE(RangeWithin(11, 0, 10));
  EXPECT_FALSE(RangeWithin(5, kMax - 2, 10)) << "a wrapping offset + length";
  EXPECT_FALSE(RangeWithin(kMax, kMax, kMax - 1));
}

TEST(CheckedMath, TheIssuesSegmentSumIsCaught) {
  // 2^64 - 128 MiB + 4096 bytes plus an existing 128 MiB wraps to 4 KiB when unchecked.
  CheckedSum sum(128ull << 20);
  sum.Add(kMax - (128ull << 20) + 1 + 4096);
  EXPECT_FALSE(sum.ok());
  auto got = sum.Get("segment capacity");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(ToCode(got.status()), Code::kInvalidArgument);
  EXPECT_NE(got.status().message().find("segment capacity"), std::string_view::npos);
  sum.Add(1);
  EXPECT_FALSE(sum.ok()) << "stays failed";
}

TEST(CheckedMath, SumsAndProducts) {
  CheckedSum sum;
  sum.Add(10).AddProduct(3, 4);
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(sum.value(), 22u);
  sum.AddProduct(kMax, 2);
  EXPECT_FALSE(sum.ok());
  EXPECT_EQ(*CheckedTotal({1, 2, 3}, "x"), 6u);
  EXPECT_FALSE(CheckedTotal({kMax, 1}, "x").ok());
}

}  // namespace
}  // namespace mc
