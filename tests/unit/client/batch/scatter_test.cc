// The batch get's pure helpers: ScatterCopy, ScatterChecksum, RejectOverlappingDestinations.
#include <string>
#include <vector>

#include "client/batch/batch_get.h"
#include "common/checksum.h"
#include "gtest/gtest.h"
#include "tests/unit/client/client_test_util.h"

namespace mc::client::testing {
namespace {

std::vector<LocalBuffer> Cut(std::string& s, const std::vector<size_t>& sizes) {
  std::vector<LocalBuffer> out;
  size_t pos = 0;
  for (size_t n : sizes) {
    out.push_back({s.data() + pos, n});
    pos += n;
  }
  return out;
}

TEST(ScatterCopy, CopiesAcrossDifferentFragmentations) {
  std::string src = Payload(1000, 1);
  std::string dst(1000, kSentinel);
  auto from = Cut(src, {1, 499, 0, 300, 200});
  auto to = Cut(dst, {333, 0, 333, 334});
  EXPECT_EQ(ScatterCopy(from, to), 1000u);
  EXPECT_EQ(dst, src);
}

TEST(ScatterCopy, StopsAtTheShorterSide) {
  std::string src = Payload(100, 2);
  std::string dst(60, kSentinel);
  EXPECT_EQ(ScatterCopy(Cut(src, {50, 50}), Cut(dst, {10, 50})), 60u);
  EXPECT_EQ(dst, src.substr(0, 60));
  std::string big(200, kSentinel);
  EXPECT_EQ(ScatterCopy(Cut(src, {100}), Cut(big, {150, 50})), 100u);
  EXPECT_EQ(big.substr(0, 100), src);
  EXPECT_EQ(big.substr(100), std::string(100, kSentinel));
  EXPECT_EQ(ScatterCopy({}, Cut(big, {200})), 0u);
}

TEST(ScatterChecksum, EqualsTheChecksumOfTheConcatenation) {
  std::string s = Payload(10'000, 3);
  const uint64_t want = Checksum(s);
  EXPECT_EQ(ScatterChecksum(Cut(s, {10'000})), want);
  EXPECT_EQ(ScatterChecksum(Cut(s, {1, 9'998, 1})), want);
  EXPECT_EQ(ScatterChecksum(Cut(s, {0, 5000, 0, 5000})), want);
  std::string t = s;
  t[5000] ^= 1;
  EXPECT_NE(ScatterChecksum(Cut(t, {2500, 7500})), want);
}

TEST(RejectOverlappingDestinations, MarksBothSidesOfEveryOverlap) {
  std::string mem(1000, '\0');
  char* b = mem.data();
  std::vector<GetRequestItem> items(6);
  items[0].slices = {{b, 100}};
  items[1].slices = {{b + 100, 100}};  // adjacent to 0: fine
  items[2].slices = {{b + 300, 100}};
  items[3].slices = {{b + 250, 60}};                 // overlaps 2
  items[4].slices = {{b + 500, 50}, {b + 520, 10}};  // overlaps itself
  items[5].slices = {{b + 600, 0}, {b + 600, 10}};   // empty slice overlaps nothing
  RejectOverlappingDestinations(items);
  EXPECT_TRUE(items[0].input_error.ok());
  EXPECT_TRUE(items[1].input_error.ok());
  EXPECT_EQ(ToCode(items[2].input_error), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(items[3].input_error), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(items[4].input_error), Code::kInvalidArgument);
  EXPECT_TRUE(items[5].input_error.ok());
}

TEST(RejectOverlappingDestinations, ContainedRangeAfterALongOneIsCaught) {
  std::string mem(1000, '\0');
  char* b = mem.data();
  std::vector<GetRequestItem> items(4);
  items[0].slices = {{b, 900}};
  items[1].slices = {{b + 950, 10}};
  items[2].slices = {{b + 100, 10}};  // inside 0
  items[3].slices = {{b + 800, 10}};  // inside 0, after 2 in sorted order
  RejectOverlappingDestinations(items);
  EXPECT_EQ(ToCode(items[0].input_error), Code::kInvalidArgument);
  EXPECT_TRUE(items[1].input_error.ok());
  EXPECT_EQ(ToCode(items[2].input_error), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(items[3].input_error), Code::kInvalidArgument);
}

TEST(RejectOverlappingDestinations, ItemsAlreadyInErrorAndInlineItemsAreIgnored) {
  std::string mem(100, '\0');
  std::vector<GetRequestItem> items(3);
  items[0].slices = {{mem.data(), 50}};
  items[0].input_error = McError(Code::kNotFound, "keep me");
  items[1].slices = {{mem.data(), 50}};
  items[2].inline_data = true;
  RejectOverlappingDestinations(items);
  EXPECT_EQ(ToCode(items[0].input_error), Code::kNotFound);
  EXPECT_TRUE(items[1].input_error.ok());
  EXPECT_TRUE(items[2].input_error.ok());
}

}  // namespace
}  // namespace mc::client::testing
