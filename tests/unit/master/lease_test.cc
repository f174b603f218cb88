// Read leases through MetadataService with a FakeClock: grant, release, expiry, removal and
// eviction interplay, and prefix (stop_at_first_miss) lookups.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/master/master_test_util.h"

namespace mc::master {
namespace {

using testing::CodeOf;
using testing::MasterFixture;

class Leases : public ::testing::Test {
 protected:
  void SetUp() override { m_.Register("c1", {1 << 20}); }
  MasterFixture m_;
};

TEST_F(Leases, GetReplicasGrantsALeaseThatBlocksRemove) {
  m_.Put("c1", "k", 100);
  LookupBatch b = m_.svc().GetReplicas({"k"}, {});
  ASSERT_TRUE(b.results[0].status.ok());
  EXPECT_NE(b.lease_id, 0u);
  EXPECT_EQ(b.lease_ttl_ms, m_.svc().options().lease_ttl_ms);
  EXPECT_EQ(m_.svc().ActiveLeaseCount(), 1u);
  EXPECT_EQ(m_.CounterValue("mc_leases_granted_total"), 1u);
  EXPECT_EQ(CodeOf(m_.svc().Remove({"k"})[0]), Code::kHasLease);
  EXPECT_TRUE(m_.Exists("k"));
}

TEST_F(Leases, ReleasedLeaseMakesObjectRemovable) {
  m_.Put("c1", "k", 100);
  LookupBatch b = m_.svc().GetReplicas({"k"}, {});
  EXPECT_EQ(m_.svc().ReleaseLeases(b.lease_id + 1, {"k"}), 0u) << "someone else's lease id";
  EXPECT_EQ(CodeOf(m_.svc().Remove({"k"})[0]), Code::kHasLease);
  EXPECT_EQ(m_.svc().ReleaseLeases(b.lease_id, {"k"}), 1u);
  EXPECT_EQ(m_.svc().ReleaseLeases(b.lease_id, {"k"}), 0u) << "released twice";
  EXPECT_EQ(m_.svc().ActiveLeaseCount(), 0u);
  EXPECT_EQ(m_.CounterValue("mc_leases_released_total"), 1u);
  EXPECT_TRUE(m_.svc().Remove({"k"})[0].ok());
}

TEST_F(Leases, OneOfTwoLeasesReleasedStillBlocksRemove) {
  m_.Put("c1", "k", 100);
  LookupBatch a = m_.svc().GetReplicas({"k"}, {});
  LookupBatch b = m_.svc().GetReplicas({"k"}, {});
  EXPECT_NE(a.lease_id, b.lease_id);
  EXPECT_EQ(m_.svc().ReleaseLeases(a.lease_id, {"k"}), 1u);
  EXPECT_EQ(CodeOf(m_.svc().Remove({"k"})[0]), Code::kHasLease);
  EXPECT_EQ(m_.svc().ReleaseLeases(b.lease_id, {"k"}), 1u);
  EXPECT_TRUE(m_.svc().Remove({"k"})[0].ok());
}

TEST_F(Leases, LeaseExpiresAfterTtlAndIsCountedByMaintenance) {
  m_.Put("c1", "k", 100);
  m_.svc().GetReplicas({"k"}, {});
  m_.clock().AdvanceMs(m_.svc().options().lease_ttl_ms - 1);
  EXPECT_EQ(CodeOf(m_.svc().Remove({"k"})[0]), Code::kHasLease);
  m_.clock().AdvanceMs(1);
  EXPECT_EQ(m_.svc().ActiveLeaseCount(), 0u);
  EXPECT_EQ(m_.CounterValue("mc_leases_expired_total"), 0u);
  m_.HeartbeatAll();
  m_.svc().RunMaintenance();
  EXPECT_EQ(m_.CounterValue("mc_leases_expired_total"), 1u);
  EXPECT_TRUE(m_.svc().Remove({"k"})[0].ok());
}

TEST_F(Leases, KeysLeasedAgainAfterAReleaseOrASweepStillExpire) {
  // The lease index keeps released keys until the sweep; a key leased again in either state
  // must still be found by the sweep when that lease expires.
  m_.Put("c1", "k", 100);
  const int64_t ttl = m_.svc().options().lease_ttl_ms;
  for (int round = 0; round < 2; ++round) {
    LookupBatch first = m_.svc().GetReplicas({"k"}, {});
    EXPECT_EQ(m_.svc().ReleaseLeases(first.lease_id, {"k"}), 1u);
    if (round == 1) {  // the sweep drops the released key from the index
      m_.HeartbeatAll();
      m_.svc().RunMaintenance();
    }
    m_.svc().GetReplicas({"k"}, {});  // leased again, never released
    EXPECT_EQ(m_.svc().ActiveLeaseCount(), 1u);
    m_.clock().AdvanceMs(ttl);
    m_.HeartbeatAll();
    m_.svc().RunMaintenance();
    EXPECT_EQ(m_.CounterValue("mc_leases_expired_total"), static_cast<uint64_t>(round + 1));
    EXPECT_EQ(m_.svc().ActiveLeaseCount(), 0u);
  }
  EXPECT_TRUE(m_.svc().Remove({"k"})[0].ok());
}

TEST_F(Leases, ExpiredLeaseIsRemovableEvenBeforeMaintenance) {
  m_.Put("c1", "k", 100);
  m_.svc().GetReplicas({"k"}, {});
  m_.clock().AdvanceMs(m_.svc().options().lease_ttl_ms);
  EXPECT_TRUE(m_.svc().Remove({"k"})[0].ok());
}

TEST_F(Leases, ExpiredLeasesPrunedByALaterLookupAreStillCountedAsExpired) {
  m_.Put("c1", "k", 100);
  m_.svc().GetReplicas({"k"}, {});
  m_.clock().AdvanceMs(m_.svc().options().lease_ttl_ms + 1);
  m_.svc().GetReplicas({"k"}, {});  // prunes the expired lease while granting a new one
  m_.clock().AdvanceMs(m_.svc().options().lease_ttl_ms + 1);
  m_.HeartbeatAll();
  m_.svc().RunMaintenance();
  EXPECT_EQ(m_.CounterValue("mc_leases_granted_total"), 2u);
  EXPECT_EQ(m_.CounterValue("mc_leases_expired_total"), 2u);
}

TEST_F(Leases, ReleasingAnExpiredLeaseCountsItAsExpiredNotReleased) {
  m_.Put("c1", "k", 100);
  LookupBatch b = m_.svc().GetReplicas({"k"}, {});
  m_.clock().AdvanceMs(m_.svc().options().lease_ttl_ms + 1);
  EXPECT_EQ(m_.svc().ReleaseLeases(b.lease_id, {"k"}), 0u);
  m_.HeartbeatAll();
  m_.svc().RunMaintenance();
  EXPECT_EQ(m_.CounterValue("mc_leases_released_total"), 0u);
  EXPECT_EQ(m_.CounterValue("mc_leases_expired_total"), 1u);
}

TEST_F(Leases, CallerTtlIsHonouredAndCappedAtMax) {
  m_.Put("c1", "k", 100);
  LookupBatch b = m_.svc().GetReplicas({"k"}, {.lease_ttl_ms = 100});
  EXPECT_EQ(b.lease_ttl_ms, 100);
  m_.clock().AdvanceMs(100);
  EXPECT_TRUE(m_.svc().Remove({"k"})[0].ok());
  m_.Put("c1", "k2", 100);
  LookupBatch c = m_.svc().GetReplicas({"k2"}, {.lease_ttl_ms = 1'000'000'000});
  EXPECT_EQ(c.lease_ttl_ms, m_.svc().options().max_lease_ttl_ms);
}

TEST_F(Leases, NoLeaseLookupGrantsNothing) {
  m_.Put("c1", "k", 100);
  LookupBatch b = m_.svc().GetReplicas({"k"}, {.grant_lease = false});
  EXPECT_TRUE(b.results[0].status.ok());
  EXPECT_EQ(b.lease_id, 0u);
  EXPECT_EQ(m_.svc().ActiveLeaseCount(), 0u);
  EXPECT_TRUE(m_.svc().Remove({"k"})[0].ok());
}

TEST_F(Leases, LeasedObjectsAreNeverEvicted) {
  // Fill all memory with objects, lease all of them; a further put is NO_SPACE, nothing evicted.
  const uint64_t kSize = 1 << 16;  // 16 objects fill the 1 MiB segment
  std::vector<std::string> keys;
  for (int i = 0; i < 16; ++i) {
    keys.push_back("k" + std::to_string(i));
    m_.Put("c1", keys.back(), kSize);
  }
  std::vector<std::string_view> views(keys.begin(), keys.end());
  LookupBatch b = m_.svc().GetReplicas(views, {});
  PutStartOutcome o = m_.Start("c1", "new", kSize);
  EXPECT_EQ(CodeOf(o.status), Code::kNoSpace);
  m_.HeartbeatAll();
  m_.svc().RunMaintenance();  // above the high watermark, but all leased
  for (const auto& k : keys) EXPECT_TRUE(m_.Exists(k)) << k;
  EXPECT_EQ(m_.svc().Snapshot().eviction.evicted_keys, 0u);
  EXPECT_GT(m_.svc().Snapshot().eviction.skipped_leased, 0u);
  // Release one lease: exactly that object becomes evictable.
  EXPECT_EQ(m_.svc().ReleaseLeases(b.lease_id, {views[7]}), 1u);
  o = m_.Start("c1", "new", kSize);
  EXPECT_TRUE(o.status.ok()) << o.status;
  EXPECT_FALSE(m_.Exists("k7"));
  for (int i = 0; i < 16; ++i) {
    if (i != 7) {
      EXPECT_TRUE(m_.Exists(keys[i])) << keys[i];
    }
  }
}

TEST_F(Leases, PrefixLookupStopsAtFirstMissAndLeasesOnlyThePrefix) {
  m_.Put("c1", "a", 100);
  m_.Put("c1", "c", 100);  // b is missing; c exists at a longer boundary
  LookupBatch b = m_.svc().GetReplicas({"a", "b", "c"}, {.stop_at_first_miss = true});
  size_t matched = 0;
  while (matched < b.results.size() && b.results[matched].status.ok()) ++matched;
  EXPECT_EQ(matched, 1u);
  ASSERT_LE(b.results.size(), 2u) << "results past the first miss must not be reported";
  if (b.results.size() == 2) {
    EXPECT_EQ(CodeOf(b.results[1].status), Code::kNotFound);
  }
  EXPECT_EQ(m_.svc().ActiveLeaseCount(), 1u) << "only a may be leased";
  EXPECT_EQ(CodeOf(m_.svc().Remove({"a"})[0]), Code::kHasLease);
  EXPECT_TRUE(m_.svc().Remove({"c"})[0].ok()) << "c must not be leased";
}

TEST_F(Leases, PrefixLookupStopsAtPendingKey) {
  m_.Put("c1", "a", 100);
  m_.Start("c1", "b", 100);
  m_.Put("c1", "c", 100);
  LookupBatch b = m_.svc().GetReplicas({"a", "b", "c"}, {.stop_at_first_miss = true});
  ASSERT_GE(b.results.size(), 2u);
  EXPECT_TRUE(b.results[0].status.ok());
  EXPECT_EQ(CodeOf(b.results[1].status), Code::kNotReady);
  EXPECT_LE(b.results.size(), 2u);
  EXPECT_EQ(m_.svc().ActiveLeaseCount(), 1u);
}

TEST_F(Leases, PrefixLookupWithAllKeysPresentMatchesAll) {
  for (const char* k : {"a", "b", "c"}) m_.Put("c1", k, 100);
  LookupBatch b = m_.svc().GetReplicas({"a", "b", "c"}, {.stop_at_first_miss = true});
  ASSERT_EQ(b.results.size(), 3u);
  for (const auto& r : b.results) EXPECT_TRUE(r.status.ok());
  EXPECT_EQ(m_.svc().ActiveLeaseCount(), 3u);
}

TEST_F(Leases, FirstKeyMissingMatchesNothingAndLeasesNothing) {
  m_.Put("c1", "b", 100);
  LookupBatch b = m_.svc().GetReplicas({"a", "b"}, {.stop_at_first_miss = true});
  EXPECT_FALSE(b.results.empty() ? false : b.results[0].status.ok());
  EXPECT_LE(b.results.size(), 1u);
  EXPECT_EQ(m_.svc().ActiveLeaseCount(), 0u);
}

TEST_F(Leases, LongPrefixLooksUpNothingPastTheChunkOfTheFirstMiss) {
  // 600 keys, the 10th missing: keys beyond the first lookup step are never looked up, so they
  // are neither leased nor touched; only the prefix stays leased.
  std::vector<std::string> keys;
  for (int i = 0; i < 600; ++i) keys.push_back("p" + std::to_string(i));
  for (int i = 0; i < 600; ++i) {
    if (i != 10) m_.Put("c1", keys[i], 64);
  }
  std::vector<std::string_view> views(keys.begin(), keys.end());
  LookupBatch b = m_.svc().GetReplicas(views, {.stop_at_first_miss = true});
  ASSERT_EQ(b.results.size(), 11u);
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(b.results[i].status.ok()) << i;
  EXPECT_EQ(CodeOf(b.results[10].status), Code::kNotFound);
  EXPECT_EQ(m_.svc().ActiveLeaseCount(), 10u);
  EXPECT_TRUE(m_.svc().Remove({"p11"})[0].ok()) << "a key past the miss must not stay leased";
  EXPECT_TRUE(m_.svc().Remove({"p599"})[0].ok());
}

TEST_F(Leases, LongPrefixAllPresentMatchesEveryChunk) {
  std::vector<std::string> keys;
  for (int i = 0; i < 1000; ++i) keys.push_back("q" + std::to_string(i));
  for (const auto& k : keys) m_.Put("c1", k, 64);
  std::vector<std::string_view> views(keys.begin(), keys.end());
  LookupBatch b = m_.svc().GetReplicas(views, {.stop_at_first_miss = true, .grant_lease = false});
  ASSERT_EQ(b.results.size(), 1000u);
  for (const auto& r : b.results) EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(m_.svc().ActiveLeaseCount(), 0u);
}

TEST_F(Leases, LookupWithoutReplicasAnswersSizeChecksumAndGeneration) {
  m_.Put("c1", "k", 100);
  LookupBatch full = m_.svc().GetReplicas({"k"}, {.grant_lease = false});
  LookupBatch bare = m_.svc().GetReplicas({"k"}, {.grant_lease = false, .with_replicas = false});
  ASSERT_TRUE(bare.results[0].status.ok()) << bare.results[0].status;
  EXPECT_TRUE(bare.results[0].replicas.empty());
  EXPECT_FALSE(full.results[0].replicas.empty());
  EXPECT_EQ(bare.results[0].size, 100u);
  EXPECT_EQ(bare.results[0].checksum, full.results[0].checksum);
  EXPECT_EQ(bare.results[0].generation, full.results[0].generation);
}

// Master memory per lease: the shards keep each leased object's leases and each lookup's grant
// record; both go with the release of the last lease (in grant order or not), or with the lease
// sweep once the leases expired. Objects get no transient record for a lease.
TEST_F(Leases, LeasesAndTheirRecordsComeAndGo) {
  m_.Put("c1", "k", 100);
  m_.Put("c1", "other", 100);
  m_.Put("c1", "third", 100);
  auto records = [&] {
    const MetadataService::LeaseRecords n = m_.svc().LeaseRecordCounts();
    return std::pair<size_t, size_t>(n.objects, n.grants);
  };
  using Counts = std::pair<size_t, size_t>;
  EXPECT_EQ(records(), Counts(0, 0));
  LookupBatch first = m_.svc().GetReplicas({"k"}, {});
  LookupBatch second = m_.svc().GetReplicas({"k"}, {});
  ASSERT_TRUE(first.results[0].status.ok());
  EXPECT_EQ(records(), Counts(1, 2));
  EXPECT_EQ(m_.svc().TransientCountForTest(), 0u);
  EXPECT_EQ(m_.svc().ActiveLeaseCount(), 2u);
  EXPECT_EQ(m_.svc().ReleaseLeases(first.lease_id, {"k"}), 1u);
  m_.svc().RunMaintenance();
  EXPECT_EQ(records(), Counts(1, 1)) << "one lease is still live";
  EXPECT_EQ(CodeOf(m_.svc().Remove({"k"})[0]), Code::kHasLease);
  EXPECT_EQ(m_.svc().ReleaseLeases(second.lease_id, {"k"}), 1u);
  EXPECT_EQ(records(), Counts(0, 0)) << "no sweep needed";
  EXPECT_EQ(m_.svc().ActiveLeaseCount(), 0u);
  // Released in another order than granted: the same answers, the same end.
  LookupBatch three = m_.svc().GetReplicas({"k", "other", "third"}, {});
  EXPECT_EQ(m_.svc().ReleaseLeases(three.lease_id, {"third", "k", "other", "k"}), 3u);
  EXPECT_EQ(records(), Counts(0, 0));
  // Expiry instead of release: the sweep frees it too, and the key can be leased again.
  ASSERT_TRUE(m_.svc().GetReplicas({"other"}, {}).results[0].status.ok());
  m_.clock().AdvanceMs(m_.svc().options().lease_ttl_ms + 1);
  m_.svc().RunMaintenance();
  EXPECT_EQ(records(), Counts(0, 0));
  ASSERT_TRUE(m_.svc().GetReplicas({"other"}, {}).results[0].status.ok());
  EXPECT_EQ(m_.svc().ActiveLeaseCount(), 1u);
  EXPECT_TRUE(m_.svc().Remove({"k"})[0].ok()) << "unleased now";
}

}  // namespace
}  // namespace mc::master
