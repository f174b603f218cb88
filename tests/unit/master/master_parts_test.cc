// The small parts the master's use-case services share: the generation counter, the set of
// disputed keys and the per-answer slots by peer, each against the contract in its header.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "common/status.h"
#include "master/disputed_keys.h"
#include "master/generation_counter.h"
#include "master/peer_slots.h"

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

// A slot reads as set only to the instance that set it: instances alive at once on one thread
// (they share the thread's table) and later instances start from nothing, and another thread's
// table is its own.
TEST(PeerSlots, EachInstanceSeesOnlyWhatItSet) {
  PeerSlots<int> a;
  auto [slot, first] = a.Slot(3);
  EXPECT_TRUE(first);
  EXPECT_EQ(*slot, 0);
  *slot = 30;
  EXPECT_EQ(a.Slot(3), std::make_pair(slot, false));
  EXPECT_TRUE(a.Slot(1000).second) << "the table grows past the highest index met";
  EXPECT_EQ(*a.Slot(3).first, 30) << "and keeps what was set";
  {
    PeerSlots<int> b;  // alive beside `a`, same table
    auto [b3, b_first] = b.Slot(3);
    EXPECT_TRUE(b_first) << "a's value is not b's";
    EXPECT_EQ(*b3, 0);
    *b3 = 31;
    EXPECT_EQ(*b.Slot(3).first, 31);
  }
  auto [again, again_first] = a.Slot(3);
  EXPECT_TRUE(again_first) << "b overwrote it: a works it out again, never reads 31 as its own";
  EXPECT_EQ(*again, 0);
  *again = 32;
  PeerSlots<int> later;
  EXPECT_TRUE(later.Slot(3).second);
  std::thread([&a] {
    auto [there, there_first] = a.Slot(3);
    EXPECT_TRUE(there_first) << "another thread's table";
    *there = 33;
  }).join();
  EXPECT_EQ(a.Slot(3), std::make_pair(again, true)) << "`later` took the slot here";
}

// Indices past the table per thread take slots of the instance's own, with the same answers.
TEST(PeerSlots, IndicesPastTheTableHaveSlotsOfTheirOwn) {
  constexpr uint32_t kFar = PeerSlots<int>::kDirectPeers + 5;
  PeerSlots<int> a;
  PeerSlots<int> b;
  auto [slot, first] = a.Slot(kFar);
  EXPECT_TRUE(first);
  *slot = 7;
  EXPECT_EQ(a.Slot(kFar), std::make_pair(slot, false));
  EXPECT_TRUE(b.Slot(kFar).second) << "b's own";
  EXPECT_EQ(*a.Slot(kFar).first, 7);
  auto [near, near_first] = a.Slot(PeerSlots<int>::kDirectPeers - 1);
  EXPECT_TRUE(near_first) << "the last index of the table";
  *near = 8;
  EXPECT_EQ(*a.Slot(PeerSlots<int>::kDirectPeers - 1).first, 8);
}

}  // namespace
}  // namespace mc::master
