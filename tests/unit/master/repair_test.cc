// Self-repair through MetadataService::ReportReplicaFaults with a FakeClock: corrupt memory
// replicas dropped (their space freed only after the leases that cover them), the last one taking
// its key with it so the key can be stored again, reports refused without a lease; unreachable
// holders dropped only when the master can confirm they are gone.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/master/master_test_util.h"

namespace mc::master {
namespace {

using testing::CodeOf;
using testing::MasterFixture;

class Repair : public ::testing::Test {
 protected:
  void SetUp() override {
    m_.Register("c1", {1 << 20});
    m_.Register("c2", {1 << 20});
  }
  // The memory replica of `key` on `holder`, as a CORRUPT report names it.
  ReplicaFaultItem Corrupt(std::string_view key, const std::string& holder) {
    LookupOptions peek;
    peek.grant_lease = false;
    LookupBatch b = m_.svc().GetReplicas({key}, peek);
    ReplicaFaultItem item;
    item.fault = ReplicaFault::kCorrupt;
    item.key = key;
    item.generation = b.results[0].generation;
    item.holder = holder;
    for (const StoredReplica& r : b.results[0].replicas) {
      if (r.client_id() == holder) {
        item.segment_id = r.segment_id;
        item.offset = r.offset;
      }
    }
    return item;
  }
  std::vector<std::string> Holders(std::string_view key) {
    LookupOptions peek;
    peek.grant_lease = false;
    std::vector<std::string> out;
    const LookupBatch b = m_.svc().GetReplicas({key}, peek);
    for (const StoredReplica& r : b.results[0].replicas) {
      out.push_back(r.client_id());
    }
    return out;
  }
  uint64_t Dropped() {
    return m_.CounterValue("mc_replicas_dropped_total",
                           {{"tier", "memory"}, {"reason", "corrupt"}});
  }
  MasterFixture m_;
};

TEST_F(Repair, CorruptReplicaLeavesLookupsAndItsSpaceWaitsForTheLeases) {
  m_.Put("c1", "k", 1000, 2);
  ReplicaFaultItem bad = Corrupt("k", "c1");
  LookupOptions leased;
  leased.lease_owner = 7;
  ASSERT_TRUE(m_.svc().GetReplicas({"k"}, leased).results[0].status.ok());
  const uint64_t used = m_.svc().ClientSegmentStats("c1").used;
  ASSERT_GT(used, 0u);

  EXPECT_TRUE(m_.svc().ReportReplicaFaults("c2", 7, {bad})[0].ok());
  EXPECT_EQ(Holders("k"), std::vector<std::string>{"c2"});
  EXPECT_EQ(Dropped(), 1u);
  // Reported twice: nothing left to drop.
  EXPECT_EQ(CodeOf(m_.svc().ReportReplicaFaults("c2", 7, {bad})[0]), Code::kNotFound);
  // A reader that looked the key up before may still be reading the range: not freed yet.
  m_.HeartbeatAll();
  m_.svc().RunMaintenance();
  EXPECT_EQ(m_.svc().ClientSegmentStats("c1").used, used);
  m_.clock().AdvanceMs(m_.svc().options().lease_ttl_ms);
  m_.HeartbeatAll();
  m_.svc().RunMaintenance();
  EXPECT_EQ(m_.svc().ClientSegmentStats("c1").used, 0u);
  EXPECT_EQ(Dropped(), 1u);
}

TEST_F(Repair, LastCorruptReplicaTakesItsKeySoTheKeyCanBeStoredAgain) {
  const uint64_t first = m_.Put("c1", "k", 1000);
  ReplicaFaultItem bad = Corrupt("k", "c1");
  ASSERT_EQ(m_.Lookup("k", /*lease=*/true), Code::kOk);
  EXPECT_EQ(CodeOf(m_.Start("c2", "k", 1000).status), Code::kAlreadyExists);

  EXPECT_TRUE(m_.svc().ReportReplicaFaults("c2", 0, {bad})[0].ok());
  EXPECT_FALSE(m_.Exists("k"));
  EXPECT_EQ(m_.CounterValue("mc_objects_lost_total", {{"reason", "corrupt"}}), 1u);
  const uint64_t again = m_.Put("c2", "k", 1000);
  EXPECT_GT(again, first);
  EXPECT_EQ(Holders("k"), std::vector<std::string>{"c2"});
}

TEST_F(Repair, CorruptReportsNeedTheReportersLiveLease) {
  m_.Put("c1", "k", 1000, 2);
  ReplicaFaultItem bad = Corrupt("k", "c1");
  // No lease at all.
  EXPECT_EQ(CodeOf(m_.svc().ReportReplicaFaults("c2", 7, {bad})[0]), Code::kPermissionDenied);
  // Another caller's lease.
  LookupOptions other;
  other.lease_owner = 8;
  m_.svc().GetReplicas({"k"}, other);
  EXPECT_EQ(CodeOf(m_.svc().ReportReplicaFaults("c2", 7, {bad})[0]), Code::kPermissionDenied);
  // Its own lease, once expired.
  LookupOptions mine;
  mine.lease_owner = 7;
  m_.svc().GetReplicas({"k"}, mine);
  m_.clock().AdvanceMs(m_.svc().options().lease_ttl_ms);
  EXPECT_EQ(CodeOf(m_.svc().ReportReplicaFaults("c2", 7, {bad})[0]), Code::kPermissionDenied);
  EXPECT_EQ(Holders("k").size(), 2u);
  EXPECT_EQ(Dropped(), 0u);
  EXPECT_EQ(m_.CounterValue("mc_master_fault_reports_refused_total"), 3u);
}

TEST_F(Repair, CorruptReportsOfAnotherGenerationOrPlaceChangeNothing) {
  m_.Put("c1", "k", 1000, 2);
  ASSERT_EQ(m_.Lookup("k", /*lease=*/true), Code::kOk);
  ReplicaFaultItem stale = Corrupt("k", "c1");
  stale.generation += 1;
  ReplicaFaultItem elsewhere = Corrupt("k", "c1");
  elsewhere.offset += 64;
  ReplicaFaultItem unknown = Corrupt("k", "c1");
  unknown.key = "nope";
  std::vector<absl::Status> out =
      m_.svc().ReportReplicaFaults("c2", 0, {stale, elsewhere, unknown});
  for (const absl::Status& s : out) EXPECT_EQ(CodeOf(s), Code::kNotFound) << s;
  EXPECT_EQ(Holders("k").size(), 2u);
}

TEST_F(Repair, UnreachableHolderIsDroppedOnlyOnceItIsSilent) {
  m_.Put("c2", "k", 1000);  // placed on the writer's own client
  ASSERT_EQ(Holders("k"), std::vector<std::string>{"c2"});
  ReplicaFaultItem gone;
  gone.fault = ReplicaFault::kUnreachable;
  gone.holder = "c2";
  // c2 heartbeats: a report alone (a network blip, or a lie) drops nothing.
  EXPECT_EQ(CodeOf(m_.svc().ReportReplicaFaults("c1", 0, {gone})[0]), Code::kNotReady);
  EXPECT_TRUE(m_.Exists("k"));
  // Silent for two heartbeat intervals: certainly not serving; dropped before its TTL.
  m_.clock().AdvanceMs(m_.svc().options().heartbeat_interval_ms * 5 / 2);
  EXPECT_TRUE(m_.svc().ReportReplicaFaults("c1", 0, {gone})[0].ok());
  EXPECT_FALSE(m_.Exists("k"));
  EXPECT_EQ(m_.svc().Snapshot().clients, 1u);
  EXPECT_EQ(m_.CounterValue("mc_master_clients_dropped_total", {{"reason", "unreachable"}}), 1u);
  EXPECT_EQ(CodeOf(m_.svc().ReportReplicaFaults("c1", 0, {gone})[0]), Code::kNotFound);
  EXPECT_EQ(m_.CounterValue("mc_master_fault_reports_refused_total"), 1u);
}

TEST_F(Repair, UnreachableHolderWhoseEndpointRegisteredAgainIsDroppedAtOnce) {
  m_.Put("c2", "k", 1000);
  // A daemon restarted under a new id on c2's address.
  ClientInfo restarted;
  restarted.client_id = "c2-new";
  restarted.host = "host-c2";
  restarted.endpoint = m_.svc().Clients()[0].client_id == "c2" ? m_.svc().Clients()[0].endpoint
                                                               : m_.svc().Clients()[1].endpoint;
  ASSERT_TRUE(m_.svc().RegisterClient(restarted, {1 << 20}).ok());
  ReplicaFaultItem gone;
  gone.fault = ReplicaFault::kUnreachable;
  gone.holder = "c2";
  EXPECT_TRUE(m_.svc().ReportReplicaFaults("c1", 0, {gone})[0].ok());
  EXPECT_FALSE(m_.Exists("k"));
}

TEST_F(Repair, AReporterCannotReportItself) {
  ReplicaFaultItem self;
  self.fault = ReplicaFault::kUnreachable;
  self.holder = "c1";
  EXPECT_EQ(CodeOf(m_.svc().ReportReplicaFaults("c1", 0, {self})[0]), Code::kInvalidArgument);
  EXPECT_EQ(m_.svc().Snapshot().clients, 2u);
}

}  // namespace
}  // namespace mc::master

namespace mc::master {
namespace {

using testing::CodeOf;
using testing::MasterFixture;

TEST(AvoidClients, PutStartPlacesAroundAvoidedClientsAndEvictsNothingForThem) {
  MasterFixture m;
  m.Register("writer", {1 << 20});
  m.Register("dead", {4 << 20});  // the largest: the first choice after the writer
  m.Register("small", {1 << 20});
  auto out = m.svc().PutStart("writer", {{"k", 1000}}, 2, {"dead"});
  ASSERT_TRUE(out[0].status.ok()) << out[0].status;
  for (const auto& r : out[0].replicas) EXPECT_NE(r.location.client_id, "dead");
  // Only "dead" could take a third replica: NO_SPACE at once, final, and nothing evicted.
  ASSERT_TRUE(m.End("writer", "k", out[0].generation).ok());
  const uint64_t keys = m.svc().KeyCount();
  auto none = m.svc().PutStart("writer", {{"k3", 1000}}, 3, {"dead"});
  EXPECT_EQ(CodeOf(none[0].status), Code::kNoSpace);
  EXPECT_TRUE(none[0].no_space_final);
  EXPECT_EQ(m.svc().KeyCount(), keys);
  EXPECT_TRUE(m.Exists("k"));
}

}  // namespace
}  // namespace mc::master
