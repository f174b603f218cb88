// Eviction through MetadataService: synchronous eviction inside PutStart, the background
// watermark pass in RunMaintenance, what is never evicted, and the counters.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/master/master_test_util.h"

namespace mc::master {
namespace {

using testing::CodeOf;
using testing::MasterFixture;

constexpr uint64_t kObject = 1024;
constexpr uint64_t kSlots = 100;  // the segment holds exactly this many objects

class Eviction : public ::testing::Test {
 protected:
  void SetUp() override { m_.Register("c1", {kObject * kSlots}); }
  std::string Key(int i) { return "key-" + std::to_string(i); }
  MasterFixture m_;
};

TEST_F(Eviction, PutsIntoFullMemorySucceedBySynchronousEviction) {
  for (int i = 0; i < 100; ++i) m_.Put("c1", Key(i), kObject);
  EXPECT_EQ(m_.svc().Snapshot().mem_used, kObject * kSlots);
  EXPECT_EQ(m_.svc().Snapshot().eviction.attempts, 0u);
  for (int i = 100; i < 1100; ++i) {
    PutStartOutcome o = m_.Start("c1", Key(i), kObject);
    ASSERT_TRUE(o.status.ok()) << i << ": " << o.status;
    ASSERT_TRUE(m_.End("c1", Key(i), o.generation).ok());
  }
  MasterSnapshot s = m_.svc().Snapshot();
  EXPECT_EQ(s.keys, kSlots);
  EXPECT_GE(s.eviction.attempts, 1000u);
  EXPECT_GE(static_cast<double>(s.eviction.successes), 0.99 * s.eviction.attempts)
      << s.eviction.successes << "/" << s.eviction.attempts;
  EXPECT_EQ(s.eviction.successes + s.eviction.failures, s.eviction.attempts);
  EXPECT_EQ(s.eviction.evicted_keys, 1000u);
  EXPECT_EQ(s.eviction.evicted_bytes, 1000u * kObject);
  EXPECT_EQ(m_.CounterValue("mc_put_no_space_total"), 0u);
  // The newest objects survived.
  EXPECT_TRUE(m_.Exists(Key(1099)));
  EXPECT_FALSE(m_.Exists(Key(0)));
}

TEST_F(Eviction, SustainedPressureWithMixedSizesKeepsSuccessRatioHigh) {
  uint64_t ok = 0;
  for (int i = 0; i < 3000; ++i) {
    uint64_t size = 64 * (1 + (i * 7919) % 32);  // 64 B .. 2 KiB
    PutStartOutcome o = m_.Start("c1", Key(i), size);
    ASSERT_TRUE(o.status.ok()) << i << ": " << o.status;
    ASSERT_TRUE(m_.End("c1", Key(i), o.generation).ok());
    ++ok;
    if (i % 50 == 0) {
      m_.HeartbeatAll();
      m_.svc().RunMaintenance();
    }
  }
  EvictionStats e = m_.svc().Snapshot().eviction;
  EXPECT_GT(e.attempts, 0u);
  EXPECT_GE(static_cast<double>(e.successes), 0.99 * e.attempts)
      << e.successes << "/" << e.attempts;
  EXPECT_EQ(e.successes + e.failures, e.attempts);
}

TEST_F(Eviction, LeastRecentlyUsedIsEvictedFirst) {
  for (int i = 0; i < 100; ++i) {
    m_.Put("c1", Key(i), kObject);
    m_.clock().AdvanceMs(1);  // LRU across shards is by last-access time
  }
  m_.clock().AdvanceMs(10);
  // Read key-0 (and release its lease): it becomes the most recently used.
  LookupBatch b = m_.svc().GetReplicas({Key(0)}, {});
  m_.svc().ReleaseLeases(b.lease_id, {Key(0)});
  m_.clock().AdvanceMs(10);
  m_.Put("c1", "new", kObject);
  EXPECT_TRUE(m_.Exists(Key(0)));
  EXPECT_FALSE(m_.Exists(Key(1)));
  EXPECT_TRUE(m_.Exists(Key(2)));
}

// The bound of the approximate LRU (reads mark, SecondChance moves): every object read since it
// was placed outlives every object not read since, and the unread ones go oldest first.
TEST_F(Eviction, ObjectsReadSinceTheyWerePlacedOutliveEveryUnreadOne) {
  for (int i = 0; i < 100; ++i) {
    m_.Put("c1", Key(i), kObject);
    m_.clock().AdvanceMs(1);
  }
  m_.clock().AdvanceMs(10);
  std::vector<std::string> read;
  for (int i = 0; i < 100; i += 7) read.push_back(Key(i));
  std::vector<std::string_view> views(read.begin(), read.end());
  LookupBatch b = m_.svc().GetReplicas(views, {});
  m_.svc().ReleaseLeases(b.lease_id, views);
  m_.clock().AdvanceMs(10);
  // Each new put evicts one object: the unread ones, oldest first, and none that was read.
  int evicted = 0;
  for (int n = 0; n < 50; ++n) {
    m_.Put("c1", "new" + std::to_string(n), kObject);
    m_.clock().AdvanceMs(1);
  }
  for (int i = 0; i < 100; ++i) {
    const bool was_read = i % 7 == 0;
    if (!m_.Exists(Key(i))) {
      ++evicted;
      EXPECT_FALSE(was_read) << Key(i);
    }
  }
  EXPECT_GE(evicted, 50);
  // The survivors among the unread are the most recently placed ones.
  int first_unread_kept = -1;
  for (int i = 0; i < 100 && first_unread_kept < 0; ++i) {
    if (i % 7 != 0 && m_.Exists(Key(i))) first_unread_kept = i;
  }
  ASSERT_GE(first_unread_kept, 0);
  for (int i = first_unread_kept; i < 100; ++i) EXPECT_TRUE(m_.Exists(Key(i))) << Key(i);
}

// A count-only prefix probe (the unleased MatchPrefix) is not a read: like Exist, it leaves the
// LRU order alone, so probing cold keys does not keep them in memory.
TEST_F(Eviction, CountOnlyProbeDoesNotRefreshRecency) {
  for (int i = 0; i < 100; ++i) {
    m_.Put("c1", Key(i), kObject);
    m_.clock().AdvanceMs(1);
  }
  m_.clock().AdvanceMs(10);
  LookupOptions probe{
      .stop_at_first_miss = true, .grant_lease = false, .with_replicas = false, .touch = false};
  LookupBatch b = m_.svc().GetReplicas({Key(0), Key(1)}, probe);
  ASSERT_EQ(b.results.size(), 2u);
  EXPECT_TRUE(b.results[0].status.ok());
  EXPECT_TRUE(b.results[1].status.ok());
  m_.clock().AdvanceMs(10);
  m_.Put("c1", "new", kObject);
  EXPECT_FALSE(m_.Exists(Key(0))) << "the probe must not have made key-0 recent";
  EXPECT_TRUE(m_.Exists(Key(1)));
}

TEST_F(Eviction, BackgroundPassBringsUsageFromAboveHighToLowWatermark) {
  for (int i = 0; i < 97; ++i) m_.Put("c1", Key(i), kObject);
  MasterSnapshot before = m_.svc().Snapshot();
  ASSERT_GT(static_cast<double>(before.mem_used) / before.mem_capacity,
            m_.svc().options().eviction.high_watermark);
  ASSERT_EQ(before.eviction.attempts, 0u);
  m_.HeartbeatAll();
  m_.svc().RunMaintenance();
  MasterSnapshot after = m_.svc().Snapshot();
  EXPECT_LE(static_cast<double>(after.mem_used) / after.mem_capacity,
            m_.svc().options().eviction.low_watermark);
  EXPECT_EQ(after.eviction.attempts, 1u);
  EXPECT_EQ(after.eviction.successes, 1u);
  EXPECT_EQ(after.eviction.failures, 0u);
  EXPECT_EQ(after.eviction.evicted_keys, 7u);
  // Below the high watermark, maintenance does nothing.
  m_.svc().RunMaintenance();
  EXPECT_EQ(m_.svc().Snapshot().eviction.attempts, 1u);
}

TEST_F(Eviction, AtOrBelowHighWatermarkMaintenanceDoesNotEvict) {
  for (int i = 0; i < 95; ++i) m_.Put("c1", Key(i), kObject);
  m_.HeartbeatAll();
  m_.svc().RunMaintenance();
  EXPECT_EQ(m_.svc().Snapshot().eviction.attempts, 0u);
  EXPECT_EQ(m_.svc().KeyCount(), 95u);
}

TEST_F(Eviction, AnObjectNoSegmentCanHoldEvictsNothing) {
  for (int i = 0; i < 100; ++i) m_.Put("c1", Key(i), kObject);
  // Larger than the only segment: no eviction can make room, so none may be tried.
  PutStartOutcome o = m_.Start("c1", "huge", kObject * kSlots + 1);
  EXPECT_EQ(CodeOf(o.status), Code::kNoSpace) << o.status;
  EXPECT_NE(o.status.message().find("largest segment"), std::string::npos) << o.status;
  EXPECT_EQ(m_.svc().Snapshot().eviction.evicted_keys, 0u);
  EXPECT_EQ(m_.svc().KeyCount(), 100u);
  // Two replicas with one client: no room can be made either.
  o = m_.Start("c1", "two", kObject, /*replicas=*/2);
  EXPECT_EQ(CodeOf(o.status), Code::kNoSpace) << o.status;
  EXPECT_EQ(m_.svc().Snapshot().eviction.evicted_keys, 0u);
  EXPECT_EQ(m_.svc().KeyCount(), 100u);
}

TEST_F(Eviction, PendingObjectsAreNeverEvicted) {
  std::vector<uint64_t> gens;
  for (int i = 0; i < 100; ++i) {
    PutStartOutcome o = m_.Start("c1", Key(i), kObject);
    ASSERT_TRUE(o.status.ok());
    gens.push_back(o.generation);
  }
  PutStartOutcome o = m_.Start("c1", "new", kObject);
  EXPECT_EQ(CodeOf(o.status), Code::kNoSpace);
  m_.HeartbeatAll();
  m_.svc().RunMaintenance();
  EvictionStats e = m_.svc().Snapshot().eviction;
  EXPECT_EQ(e.evicted_keys, 0u);
  EXPECT_GT(e.skipped_pending, 0u);
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(m_.End("c1", Key(i), gens[i]).ok()) << i;
}

TEST_F(Eviction, NoSpaceOnlyWhenEverythingIsLeasedOrPending) {
  std::vector<std::string> keys;
  for (int i = 0; i < 50; ++i) m_.Put("c1", Key(i), kObject);
  for (int i = 50; i < 100; ++i) ASSERT_TRUE(m_.Start("c1", Key(i), kObject).status.ok());
  std::vector<std::string> leased_keys;
  for (int i = 0; i < 50; ++i) leased_keys.push_back(Key(i));
  std::vector<std::string_view> views(leased_keys.begin(), leased_keys.end());
  LookupBatch b = m_.svc().GetReplicas(views, {});
  EXPECT_EQ(CodeOf(m_.Start("c1", "new", kObject).status), Code::kNoSpace);
  EvictionStats e = m_.svc().Snapshot().eviction;
  EXPECT_GT(e.skipped_leased, 0u);
  EXPECT_GT(e.skipped_pending, 0u);
  EXPECT_EQ(e.evicted_keys, 0u);
  EXPECT_EQ(e.successes, 0u);
  EXPECT_GE(e.failures, 1u);
  EXPECT_EQ(e.failures, e.attempts);
  EXPECT_EQ(m_.CounterValue("mc_eviction_failures_total"), e.failures);
  // One evictable object is enough.
  m_.svc().ReleaseLeases(b.lease_id, {views[3]});
  EXPECT_TRUE(m_.Start("c1", "new", kObject).status.ok());
  EXPECT_FALSE(m_.Exists(Key(3)));
}

TEST_F(Eviction, ObjectLargerThanAnyFreeRangeEvictsUntilItFits) {
  for (int i = 0; i < 100; ++i) m_.Put("c1", Key(i), kObject);
  PutStartOutcome o = m_.Start("c1", "big", 4 * kObject);
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_GE(m_.svc().Snapshot().eviction.evicted_keys, 4u);
}

TEST_F(Eviction, ObjectWithDiskReplicaKeepsItAfterMemoryEviction) {
  ClientInfo c2;
  c2.client_id = "c2";
  c2.host = "h2";
  c2.endpoint = "h2:1";
  c2.disk_capacity = 1 << 30;
  ASSERT_TRUE(m_.svc().RegisterClient(c2, {}).ok());
  uint64_t gen = m_.Put("c1", "ssd", kObject);
  ASSERT_TRUE(m_.svc().AddDiskReplicas("c2", {{"ssd", gen, 77, kObject, 42}}, false)[0].ok());
  m_.clock().AdvanceMs(1);  // "ssd" is the least recently used
  for (int i = 0; i < 100; ++i) m_.Put("c1", Key(i), kObject);
  LookupBatch b = m_.svc().GetReplicas({"ssd"}, {.grant_lease = false});
  ASSERT_TRUE(b.results[0].status.ok()) << b.results[0].status;
  ASSERT_EQ(b.results[0].replicas.size(), 1u);
  EXPECT_EQ(b.results[0].replicas[0].tier, ReplicaTier::kDisk);
  EXPECT_EQ(b.results[0].replicas[0].offset, 77u);
}

TEST_F(Eviction, StatusLineReportsEvictionCounters) {
  for (int i = 0; i < 101; ++i) m_.Put("c1", Key(i), kObject);
  std::string line = m_.svc().StatusLine();
  EXPECT_NE(line.find("Eviction: Success/Attempts=1/1"), std::string::npos) << line;
  EXPECT_NE(line.find("Keys: 100 |"), std::string::npos) << line;
  EXPECT_NE(line.find("Clients: 1 |"), std::string::npos) << line;
}

}  // namespace
}  // namespace mc::master
