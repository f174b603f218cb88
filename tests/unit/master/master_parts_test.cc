// The small parts the master's use-case services share: the generation counter and the set of
// disputed keys, each against the contract in its header.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "master/disputed_keys.h"
#include "master/generation_counter.h"

namespace mc::master {
namespace {

uint64_t WallGeneration(int64_t ahead_ms = 0) {
  const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  return static_cast<uint64_t>(ms + ahead_ms) << 20;
}

TEST(GenerationCounter, StartsAtTheWallClockAndOnlyGoesUp) {
  const uint64_t before = WallGeneration();
  GenerationCounter counter;
  const uint64_t first = counter.Next();
  EXPECT_GE(first, before) << "a restarted master never reuses an earlier run's generations";
  EXPECT_LE(first, WallGeneration());
  EXPECT_EQ(counter.Next(), first + 1);
  counter.RaisePast(first + 100);
  EXPECT_EQ(counter.Next(), first + 101);
  counter.RaisePast(first);  // lower: never lowers the counter
  EXPECT_EQ(counter.Next(), first + 102);
}

TEST(GenerationCounter, ExhaustedAnswersZeroAndNeverWraps) {
  GenerationCounter counter;
  counter.RaisePast(kGenerationLimit - 2);
  EXPECT_EQ(counter.Next(), kGenerationLimit - 1);
  EXPECT_EQ(counter.Next(), 0u);
  EXPECT_EQ(counter.Next(), 0u);
}

TEST(GenerationCounter, ReportedGenerationsMustBeOnesAMasterCouldHaveIssued) {
  GenerationCounter counter;
  const uint64_t issued = counter.Next();
  EXPECT_TRUE(counter.CheckReported(issued).ok());
  EXPECT_TRUE(counter.CheckReported(1).ok()) << "an old run's generation";
  EXPECT_TRUE(counter.CheckReported(WallGeneration(kGenerationLeadMs / 2)).ok())
      << "a master whose clock runs ahead by less than the lead";
  EXPECT_EQ(ToCode(counter.CheckReported(0)), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(counter.CheckReported(WallGeneration(2 * kGenerationLeadMs))),
            Code::kInvalidArgument);
  EXPECT_EQ(ToCode(counter.CheckReported(kGenerationLimit - 1)), Code::kInvalidArgument)
      << "no report may push the counter towards its end";
  EXPECT_EQ(ToCode(counter.CheckReported(~uint64_t{0})), Code::kInvalidArgument);
}

TEST(DisputedKeys, RemembersUntilForgottenAndFailsClosedWhenFull) {
  DisputedKeys keys;
  EXPECT_FALSE(keys.Contains("a"));
  keys.Add("a");
  EXPECT_TRUE(keys.Contains("a"));
  EXPECT_FALSE(keys.Contains("b"));
  keys.Forget("a");
  EXPECT_FALSE(keys.Contains("a"));
  for (size_t i = 0; i < kMaxDisputedKeys; ++i) keys.Add("k" + std::to_string(i));
  EXPECT_TRUE(keys.Contains("never-added")) << "full: every key counts as disputed";
  keys.Forget("k0");
  EXPECT_FALSE(keys.Contains("never-added")) << "below the cap again";
  EXPECT_TRUE(keys.Contains("k1"));
}

}  // namespace
}  // namespace mc::master
