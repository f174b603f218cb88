#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "transfer/transfer_engine.h"

namespace mc::transfer {
namespace {

TEST(SegmentTable, ResolvesRangesInside) {
  std::vector<char> mem(4096);
  SegmentTable t;
  t.Add(7, mem.data(), mem.size());
  auto p = t.Resolve(7, 100, 200);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, mem.data() + 100);
  EXPECT_TRUE(t.Resolve(7, 0, 4096).ok());
  EXPECT_TRUE(t.Resolve(7, 4096, 0).ok());
}

TEST(SegmentTable, UnknownSegmentIsNotFound) {
  SegmentTable t;
  EXPECT_EQ(ToCode(t.Resolve(1, 0, 1).status()), Code::kNotFound);
  std::vector<char> mem(16);
  t.Add(1, mem.data(), mem.size());
  t.Remove(1);
  EXPECT_EQ(ToCode(t.Resolve(1, 0, 1).status()), Code::kNotFound);
  t.Add(2, mem.data(), mem.size());
  t.Clear();
  EXPECT_EQ(ToCode(t.Resolve(2, 0, 1).status()), Code::kNotFound);
}

TEST(SegmentTable, RangePastEndIsInvalid) {
  std::vector<char> mem(4096);
  SegmentTable t;
  t.Add(1, mem.data(), mem.size());
  EXPECT_EQ(ToCode(t.Resolve(1, 4000, 97).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(t.Resolve(1, 4097, 0).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(t.Resolve(1, 0, 4097).status()), Code::kInvalidArgument);
}

TEST(SegmentTable, OverflowingRangeIsInvalid) {
  std::vector<char> mem(4096);
  SegmentTable t;
  t.Add(1, mem.data(), mem.size());
  EXPECT_EQ(ToCode(t.Resolve(1, UINT64_MAX - 10, 100).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(t.Resolve(1, 100, UINT64_MAX - 50).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(t.Resolve(1, UINT64_MAX, UINT64_MAX).status()), Code::kInvalidArgument);
}

}  // namespace
}  // namespace mc::transfer
