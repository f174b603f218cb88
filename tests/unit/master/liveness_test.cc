// Client liveness through MetadataService with a FakeClock: expiry drops a client's segments,
// replicas, replica-less objects and pending puts; re-registration drops the old session.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/master/master_test_util.h"

namespace mc::master {
namespace {

using testing::CodeOf;
using testing::MasterFixture;

class Liveness : public ::testing::Test {
 protected:
  void SetUp() override {
    s1_ = m_.Register("c1", {1 << 20});
    s2_ = m_.Register("c2", {1 << 20});
  }
  // Advances past the client TTL with only c2 heartbeating, then runs maintenance.
  void KillC1() {
    int64_t ttl = m_.svc().options().client_ttl_ms;
    for (int64_t t = 0; t <= ttl; t += ttl / 4) {
      m_.clock().AdvanceMs(ttl / 4);
      ASSERT_TRUE(m_.svc().Heartbeat("c2", s2_, 0));
      m_.svc().RunMaintenance();
    }
  }
  MasterFixture m_;
  uint64_t s1_ = 0;
  uint64_t s2_ = 0;
};

TEST_F(Liveness, HeartbeatingClientsStayAlive) {
  for (int i = 0; i < 10; ++i) {
    m_.clock().AdvanceMs(m_.svc().options().client_ttl_ms / 2);
    EXPECT_TRUE(m_.svc().Heartbeat("c1", s1_, 0));
    EXPECT_TRUE(m_.svc().Heartbeat("c2", s2_, 0));
    m_.svc().RunMaintenance();
  }
  EXPECT_EQ(m_.svc().Snapshot().clients, 2u);
  EXPECT_EQ(m_.CounterValue("mc_clients_expired_total"), 0u);
}

TEST_F(Liveness, SilentClientIsDroppedWithItsSegmentsAndObjects) {
  m_.Put("c1", "on-c1", 1000);
  m_.Put("c2", "on-c2", 1000);
  m_.Put("c1", "on-both", 1000, 2);
  KillC1();
  EXPECT_EQ(m_.CounterValue("mc_clients_expired_total"), 1u);
  MasterSnapshot s = m_.svc().Snapshot();
  EXPECT_EQ(s.clients, 1u);
  EXPECT_EQ(s.mem_capacity, 1u << 20) << "c1's segment is gone";
  EXPECT_EQ(m_.svc().ClientSegmentStats("c1").segments, 0u);
  EXPECT_FALSE(m_.Exists("on-c1"));
  EXPECT_TRUE(m_.Exists("on-c2"));
  ASSERT_TRUE(m_.Exists("on-both")) << "an object with a surviving replica survives";
  LookupBatch b = m_.svc().GetReplicas({"on-both"}, {.grant_lease = false});
  ASSERT_EQ(b.results[0].replicas.size(), 1u);
  EXPECT_EQ(b.results[0].replicas[0].client_id(), "c2");
  EXPECT_EQ(s.mem_used, m_.svc().ClientSegmentStats("c2").used);
  EXPECT_EQ(s.mem_used, 2u * 1024);
  EXPECT_FALSE(m_.svc().Heartbeat("c1", s1_, 0)) << "dropped session must re-register";
}

TEST_F(Liveness, DeadWritersPendingPutsAreRevokedAndTheirRemoteReplicasFreed) {
  PutStartOutcome o = m_.Start("c1", "pending", 10'000, 2);
  ASSERT_TRUE(o.status.ok());
  ASSERT_EQ(m_.svc().ClientSegmentStats("c2").used, 10'048u) << "one replica on c2";
  KillC1();
  EXPECT_EQ(m_.svc().KeyCount(), 0u);
  EXPECT_EQ(m_.svc().ClientSegmentStats("c2").used, 0u) << "replica on the surviving client leaked";
  EXPECT_EQ(m_.svc().Snapshot().mem_used, 0u);
  EXPECT_EQ(CodeOf(m_.End("c1", "pending", o.generation)), Code::kNotFound);
  // The key is free for another writer.
  EXPECT_TRUE(m_.Start("c2", "pending", 100).status.ok());
}

TEST_F(Liveness, SurvivorsPendingPutWithAReplicaOnTheDeadClientKeepsTheOther) {
  PutStartOutcome o = m_.Start("c2", "k", 1000, 2);
  ASSERT_TRUE(o.status.ok());
  KillC1();
  EXPECT_EQ(m_.svc().KeyCount(), 1u);
  EXPECT_EQ(m_.svc().Snapshot().mem_used, 1024u);
  ASSERT_TRUE(m_.svc().PutRevoke("c2", {{"k", o.generation}})[0].ok());
  EXPECT_EQ(m_.svc().Snapshot().mem_used, 0u);
}

TEST_F(Liveness, ExpiryAtExactlyTtlKeepsClientOneMsLaterDropsIt) {
  m_.clock().AdvanceMs(m_.svc().options().client_ttl_ms);
  m_.svc().RunMaintenance();
  EXPECT_EQ(m_.svc().Snapshot().clients, 2u);
  m_.clock().AdvanceMs(1);
  m_.svc().RunMaintenance();
  EXPECT_EQ(m_.svc().Snapshot().clients, 0u);
  EXPECT_EQ(m_.svc().Snapshot().mem_capacity, 0u);
}

TEST_F(Liveness, ReRegisterWithSameIdDropsOldState) {
  m_.Put("c1", "old", 1000);
  PutStartOutcome pending = m_.Start("c1", "pending", 1000, 2);
  ASSERT_TRUE(pending.status.ok());
  uint64_t s1b = m_.Register("c1", {1 << 21});
  EXPECT_NE(s1b, s1_);
  EXPECT_FALSE(m_.svc().Heartbeat("c1", s1_, 0)) << "stale session";
  EXPECT_TRUE(m_.svc().Heartbeat("c1", s1b, 0));
  EXPECT_FALSE(m_.Exists("old"));
  EXPECT_EQ(m_.svc().KeyCount(), 0u);
  EXPECT_EQ(m_.svc().ClientSegmentStats("c1").capacity, 1u << 21);
  EXPECT_EQ(m_.svc().ClientSegmentStats("c1").used, 0u);
  EXPECT_EQ(m_.svc().ClientSegmentStats("c2").used, 0u) << "pending replica on c2 leaked";
  EXPECT_EQ(m_.svc().Snapshot().clients, 2u);
}

TEST_F(Liveness, HeartbeatWithStaleOrUnknownSessionReturnsFalse) {
  EXPECT_FALSE(m_.svc().Heartbeat("c1", s1_ + 12345, 0));
  EXPECT_FALSE(m_.svc().Heartbeat("nobody", s1_, 0));
  EXPECT_TRUE(m_.svc().Heartbeat("c1", s1_, 0));
}

TEST_F(Liveness, UnregisterDropsClientState) {
  m_.Put("c1", "k", 1000);
  EXPECT_EQ(CodeOf(m_.svc().UnregisterClient("c1", s1_ + 1)), Code::kNotFound);
  EXPECT_TRUE(m_.Exists("k"));
  EXPECT_TRUE(m_.svc().UnregisterClient("c1", s1_).ok());
  EXPECT_FALSE(m_.Exists("k"));
  EXPECT_EQ(m_.svc().Snapshot().clients, 1u);
  EXPECT_EQ(m_.svc().Snapshot().mem_capacity, 1u << 20);
}

TEST_F(Liveness, DeadClientsDiskReplicasAreDropped) {
  s1_ = m_.Register("c1", {1 << 20}, 1 << 30);  // re-registers c1, now with an SSD tier
  uint64_t gen = m_.Put("c2", "k", 1000);
  ASSERT_TRUE(m_.svc().AddDiskReplicas("c1", {{"k", gen, 5, 1000, 42}}, false)[0].ok());
  KillC1();
  LookupBatch b = m_.svc().GetReplicas({"k"}, {.grant_lease = false});
  ASSERT_TRUE(b.results[0].status.ok());
  ASSERT_EQ(b.results[0].replicas.size(), 1u);
  EXPECT_EQ(b.results[0].replicas[0].tier, ReplicaTier::kMemory);
}

}  // namespace
}  // namespace mc::master

namespace mc::master {
namespace {

TEST(LivenessDisk, RemovedRecordDoesNotComeBackWhenItsClientReRegisters) {
  testing::MasterFixture m;
  m.Register("c1", {1 << 20}, 1 << 30);
  uint64_t gen = m.Put("c1", "k", 1000);
  ASSERT_TRUE(m.svc().AddDiskReplicas("c1", {{"k", gen, 5, 1000, 42}}, false)[0].ok());
  ASSERT_TRUE(m.svc().Remove({"k"})[0].ok());  // queues a DROP of the record for c1
  // c1 restarts before it took the DROP, and reports what it found on disk.
  uint64_t session = m.Register("c1", {1 << 20}, 1 << 30);
  EXPECT_EQ(testing::CodeOf(
                m.svc().AddDiskReplicas("c1", {{"k", gen, 5, 1000, 42}}, /*recovered=*/true)[0]),
            Code::kNotFound);
  EXPECT_FALSE(m.Exists("k"));
  // The DROP is still there for it.
  auto tasks = m.svc().TakeOffloadTasks("c1", session, 10);
  ASSERT_TRUE(tasks.ok());
  ASSERT_EQ(tasks->size(), 1u);
  EXPECT_EQ((*tasks)[0].kind, OffloadTask::Kind::kDrop);
  EXPECT_EQ((*tasks)[0].key, "k");
}

// PutStart of a client id that never registered fails every item and interns nothing: made-up
// ids cannot grow the table (nor, once it is full, reach its last-resort check).
TEST(PeerNamesFull, PutStartOfAnUnknownClientInternsNothing) {
  MasterFixture m;
  PeerNames& names = PeerNames::Instance();
  const size_t before = names.SizeForTest();
  for (int i = 0; i < 3; ++i) {
    PutStartOutcome o = m.Start("made-up-client-" + std::to_string(i), "k", 4096);
    EXPECT_FALSE(o.status.ok());
  }
  EXPECT_EQ(names.SizeForTest(), before);
}

// A full PeerNames table refuses a registration with a new (client id, endpoint) and changes
// nothing; clients already known keep working, and may register again.
TEST(PeerNamesFull, RegistrationIsRefusedNotACrashLater) {
  MasterFixture m;
  m.Register("known", {1 << 20});
  PeerNames& names = PeerNames::Instance();
  names.SetCapacityForTest(static_cast<uint32_t>(names.SizeForTest()));
  ClientInfo info;
  info.client_id = "peer-names-newcomer";
  info.host = "h";
  info.endpoint = "10.0.0.7:7";
  auto reg = m.svc().RegisterClient(info, {1 << 20});
  EXPECT_EQ(ToCode(reg.status()), Code::kNoSpace) << reg.status();
  EXPECT_EQ(m.CounterValue("mc_master_registrations_refused_total"), 1u);
  EXPECT_TRUE(m.End("known", "k", m.Start("known", "k", 4096).generation).ok())
      << "a known client puts as before";
  m.Register("known", {1 << 20});  // its pairs are interned: re-registration is fine
  names.SetCapacityForTest(UINT32_MAX);
  EXPECT_TRUE(m.svc().RegisterClient(info, {1 << 20}).ok());
}

}  // namespace
}  // namespace mc::master
