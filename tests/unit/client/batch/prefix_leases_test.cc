// PrefixLeases: pinned lookups handed out by MatchPrefix, expiring on an injected clock.
#include "client/batch/prefix_leases.h"

#include "gtest/gtest.h"
#include "tests/fakes/fake_clock.h"

namespace mc::client {
namespace {

PrefixLease MakeLease(int64_t deadline_ms, std::initializer_list<const char*> keys) {
  PrefixLease lease;
  lease.master_lease_id = 77;
  lease.deadline_ms = deadline_ms;
  for (const char* k : keys) {
    mcstore::v1::KeyReplicas kr;
    kr.set_size(std::string(k).size());
    lease.Pin(k, kr);
  }
  return lease;
}

// The release order: the rows' (the match's), whatever the key map's order; a key pinned
// twice keeps its first row.
TEST(PrefixLeases, KeysComeBackInTheOrderTheyMatched) {
  std::vector<std::string> names;
  for (int i = 0; i < 40; ++i) names.push_back("k" + std::to_string(i));
  PrefixLease lease;
  for (const auto& n : names) lease.Pin(n, mcstore::v1::KeyReplicas());
  std::vector<std::string_view> got = lease.KeysInMatchOrder();
  EXPECT_EQ(std::vector<std::string>(got.begin(), got.end()), names);
  PrefixLease twice;
  twice.IndexRows({"a", "b", "a", "c"});  // row 2 names "a" again
  got = twice.KeysInMatchOrder();
  EXPECT_EQ(std::vector<std::string>(got.begin(), got.end()),
            (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(twice.RowOf("a"), 0u);
  EXPECT_EQ(twice.RowOf("c"), 3u);
  EXPECT_TRUE(PrefixLease().KeysInMatchOrder().empty());
}

TEST(PrefixLeases, FindsPinnedKeysUntilTheDeadline) {
  FakeClock clock(1000);
  PrefixLeases leases(clock);
  uint64_t id = leases.Add(MakeLease(1500, {"a", "bb"}));
  int64_t deadline = 0;
  auto found = leases.Find(id, "bb", &deadline);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->size(), 2u);
  EXPECT_EQ(deadline, 1500);
  EXPECT_FALSE(leases.Find(id, "c", &deadline).has_value()) << "not pinned by this lease";
  EXPECT_FALSE(leases.Find(id + 1, "a", &deadline).has_value()) << "unknown lease";
  clock.SetMs(1499);
  EXPECT_TRUE(leases.Find(id, "a", &deadline).has_value());
  clock.SetMs(1500);
  EXPECT_FALSE(leases.Find(id, "a", &deadline).has_value()) << "expired at its deadline";
}

TEST(PrefixLeases, PruneDropsOnlyExpiredLeases) {
  FakeClock clock(0);
  PrefixLeases leases(clock);
  uint64_t a = leases.Add(MakeLease(100, {"a"}));
  uint64_t b = leases.Add(MakeLease(200, {"b"}));
  EXPECT_NE(a, b);
  EXPECT_EQ(leases.PruneExpired(), 0u);
  clock.AdvanceMs(150);
  EXPECT_EQ(leases.PruneExpired(), 1u);
  EXPECT_EQ(leases.Count(), 1u);
  EXPECT_FALSE(leases.Take(a).has_value());
  auto taken = leases.Take(b);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->master_lease_id, 77u);
  EXPECT_EQ(leases.Count(), 0u);
  EXPECT_FALSE(leases.Take(b).has_value()) << "taken once";
}

// PruneExpired skips its walk until the earliest deadline: a lease added later with an earlier
// deadline, and the survivors of a walk, must still set when the next walk happens.
TEST(PrefixLeases, PruneFollowsTheEarliestDeadlineAsLeasesComeAndGo) {
  FakeClock clock(0);
  PrefixLeases leases(clock);
  leases.Add(MakeLease(300, {"a"}));
  EXPECT_EQ(leases.PruneExpired(), 0u);
  leases.Add(MakeLease(100, {"b"}));  // ends before the first one
  leases.Add(MakeLease(200, {"c"}));
  clock.SetMs(100);
  EXPECT_EQ(leases.PruneExpired(), 1u) << "b";
  clock.SetMs(199);
  EXPECT_EQ(leases.PruneExpired(), 0u);
  clock.SetMs(200);
  EXPECT_EQ(leases.PruneExpired(), 1u) << "c, found after the walk that dropped b";
  uint64_t d = leases.Add(MakeLease(250, {"d"}));
  ASSERT_TRUE(leases.Take(d).has_value());  // a taken lease leaves a stale bound: harmless
  clock.SetMs(260);
  EXPECT_EQ(leases.PruneExpired(), 0u);
  EXPECT_EQ(leases.Count(), 1u);
  clock.SetMs(300);
  EXPECT_EQ(leases.PruneExpired(), 1u) << "a";
  EXPECT_EQ(leases.Count(), 0u);
}

}  // namespace
}  // namespace mc::client
