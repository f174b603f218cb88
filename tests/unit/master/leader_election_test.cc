#include "master/leader_election.h"

#include <gtest/gtest.h>

#include "master/etcd_http.h"
#include "tests/fakes/await.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_etcd.h"

namespace mc::master {
namespace {

constexpr char kKey[] = "/mcstore/leader";

struct Candidate {
  Candidate(const std::string& address, FakeEtcd& etcd, FakeClock& clock)
      : kv(etcd), election(Options(address), kv, clock, metrics) {}
  static LeaderElectionOptions Options(const std::string& address) {
    LeaderElectionOptions o;
    o.key = kKey;
    o.advertise = address;
    o.ttl_s = 3;
    return o;
  }
  double Metric(const std::string& name) {
    const std::string text = metrics.RenderPrometheus();
    const size_t at = text.find("\n" + name + " ");
    return at == std::string::npos ? -1 : std::stod(text.substr(at + name.size() + 2));
  }
  FakeEtcd::Kv kv;
  MetricsRegistry metrics;
  LeaderElection election;
};

class LeaderElectionTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  FakeEtcd etcd_{clock_};
};

TEST_F(LeaderElectionTest, FirstCandidateWinsAndServesTheOtherStandsByNamingIt) {
  Candidate a("10.0.0.1:5000", etcd_, clock_);
  Candidate b("10.0.0.2:5000", etcd_, clock_);
  EXPECT_FALSE(a.election.Serving());  // nothing before the first round
  a.election.Step();
  b.election.Step();
  EXPECT_EQ(a.election.role(), Role::kLeader);
  EXPECT_TRUE(a.election.Serving());
  EXPECT_EQ(etcd_.Value(kKey), "10.0.0.1:5000");
  EXPECT_EQ(b.election.role(), Role::kStandby);
  EXPECT_FALSE(b.election.Serving());
  EXPECT_EQ(b.election.LeaderAddress(), "10.0.0.1:5000");
  EXPECT_EQ(a.Metric("mc_master_leader"), 1);
  EXPECT_EQ(a.Metric("mc_master_elections_won_total"), 1);
  EXPECT_EQ(b.Metric("mc_master_leader"), 0);
  EXPECT_NE(b.election.StatusLine().find("role=standby leader=10.0.0.1:5000"), std::string::npos);
}

TEST_F(LeaderElectionTest, LeaderRefreshesItsLeaseAndKeepsServing) {
  Candidate a("10.0.0.1:5000", etcd_, clock_);
  a.election.Step();
  for (int i = 0; i < 20; ++i) {
    clock_.AdvanceMs(1000);  // a third of the TTL
    a.election.Step();
    ASSERT_TRUE(a.election.Serving()) << i;
  }
  EXPECT_EQ(etcd_.Value(kKey), "10.0.0.1:5000");
}

TEST_F(LeaderElectionTest, StaleRefreshFencesTheLeaderBeforeItsNextRound) {
  Candidate a("10.0.0.1:5000", etcd_, clock_);
  a.election.Step();
  clock_.AdvanceMs(1999);
  EXPECT_TRUE(a.election.Serving());
  // A leader paused (SIGSTOP) past TTL minus the margin refuses at once on resume, before its
  // election thread runs again.
  clock_.AdvanceMs(1);
  EXPECT_FALSE(a.election.Serving());
  EXPECT_EQ(a.election.role(), Role::kLeader);
}

TEST_F(LeaderElectionTest, ExpiredLeaseLosesForGoodAndCallsOnLost) {
  Candidate a("10.0.0.1:5000", etcd_, clock_);
  Candidate b("10.0.0.2:5000", etcd_, clock_);
  a.election.Step();
  // a is paused: its lease expires at etcd and b takes over.
  clock_.AdvanceMs(3001);
  b.election.Step();
  EXPECT_EQ(b.election.role(), Role::kLeader);
  EXPECT_EQ(etcd_.Value(kKey), "10.0.0.2:5000");
  // a resumes: it learns the lease is gone, stops for good.
  EventCounter lost;
  a.election.Start([&] { lost.Add(); });
  ASSERT_TRUE(lost.AwaitAtLeast(1));
  a.election.Stop();
  EXPECT_EQ(a.election.role(), Role::kLost);
  EXPECT_EQ(lost.value(), 1);
  EXPECT_FALSE(a.election.Serving());
  EXPECT_EQ(a.Metric("mc_master_leader"), 0);
  a.election.Step();  // nothing brings it back
  EXPECT_EQ(a.election.role(), Role::kLost);
  EXPECT_FALSE(a.election.Serving());
  EXPECT_EQ(etcd_.Value(kKey), "10.0.0.2:5000");
}

TEST_F(LeaderElectionTest, RefreshAnsweredLeaseGoneStepsDown) {
  Candidate a("10.0.0.1:5000", etcd_, clock_);
  a.election.Step();
  ASSERT_TRUE(a.election.Serving());
  ASSERT_TRUE(a.kv.RevokeLease(a.election.lease_id()).ok());  // e.g. revoked by an operator
  clock_.AdvanceMs(1000);
  a.election.Step();
  EXPECT_EQ(a.election.role(), Role::kLost);
  EXPECT_FALSE(a.election.Serving());
}

TEST_F(LeaderElectionTest, LeaderWhoseKeyWasDeletedStepsDownBeforeASecondOneServesLong) {
  Candidate a("10.0.0.1:5000", etcd_, clock_);
  Candidate b("10.0.0.2:5000", etcd_, clock_);
  a.election.Step();
  etcd_.Delete(kKey);  // an operator's mistake; a's lease still lives
  b.election.Step();
  ASSERT_EQ(b.election.role(), Role::kLeader);
  clock_.AdvanceMs(1000);
  a.election.Step();  // its next refresh sees the key names b
  EXPECT_EQ(a.election.role(), Role::kLost);
  EXPECT_FALSE(a.election.Serving());
}

TEST_F(LeaderElectionTest, EtcdUnreachableRefreshFencesThenLoses) {
  Candidate a("10.0.0.1:5000", etcd_, clock_);
  a.election.Step();
  etcd_.SetUp(false);
  clock_.AdvanceMs(1000);
  a.election.Step();  // fails: still within the fence
  EXPECT_TRUE(a.election.Serving());
  EXPECT_EQ(a.Metric("mc_master_etcd_errors_total"), 1);
  clock_.AdvanceMs(1000);
  a.election.Step();
  EXPECT_FALSE(a.election.Serving());  // fenced
  EXPECT_EQ(a.election.role(), Role::kLeader);
  clock_.AdvanceMs(1000);
  a.election.Step();  // a whole TTL without a refresh: the lease is gone
  EXPECT_EQ(a.election.role(), Role::kLost);
}

TEST_F(LeaderElectionTest, StandbyTakesOverWhenTheKeyDisappears) {
  Candidate a("10.0.0.1:5000", etcd_, clock_);
  Candidate b("10.0.0.2:5000", etcd_, clock_);
  a.election.Step();
  b.election.Step();
  ASSERT_EQ(b.election.role(), Role::kStandby);
  a.election.Stop();  // a clean shutdown revokes the lease
  EXPECT_FALSE(a.election.Serving());
  EXPECT_EQ(etcd_.Value(kKey), std::nullopt);
  b.election.Step();
  EXPECT_EQ(b.election.role(), Role::kLeader);
  EXPECT_TRUE(b.election.Serving());
  EXPECT_EQ(b.election.LeaderAddress(), "10.0.0.2:5000");
}

TEST_F(LeaderElectionTest, EtcdUnreachableAtStartServesNothingAndRetries) {
  etcd_.SetUp(false);
  Candidate a("10.0.0.1:5000", etcd_, clock_);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a.election.Step(), 300);
    EXPECT_FALSE(a.election.Serving());
  }
  EXPECT_EQ(a.election.role(), Role::kStandby);
  EXPECT_EQ(a.election.LeaderAddress(), "");
  EXPECT_EQ(a.Metric("mc_master_etcd_errors_total"), 3);
  etcd_.SetUp(true);
  a.election.Step();
  EXPECT_TRUE(a.election.Serving());
}

TEST_F(LeaderElectionTest, ARestartedLeaderWaitsForItsOldLeaseLikeAnyStandby) {
  {
    Candidate old_run("10.0.0.1:5000", etcd_, clock_);
    old_run.election.Step();
    ASSERT_EQ(old_run.election.role(), Role::kLeader);
    // Killed: no Stop(), the lease stays until its TTL.
    etcd_.SetUp(false);  // its destructor's revoke fails
  }
  etcd_.SetUp(true);
  Candidate again("10.0.0.1:5000", etcd_, clock_);
  again.election.Step();
  EXPECT_EQ(again.election.role(), Role::kStandby);
  EXPECT_FALSE(again.election.Serving());
  clock_.AdvanceMs(3000);
  again.election.Step();
  EXPECT_EQ(again.election.role(), Role::kLeader);
}

TEST(EtcdJson, FieldsOfGatewayAnswers) {
  const std::string keepalive =
      R"({"result":{"header":{"cluster_id":"1","member_id":"2","revision":"2"},"ID":"7","TTL":"3"}})";
  EXPECT_EQ(internal::JsonField(keepalive, "ID"), "7");
  EXPECT_EQ(internal::JsonField(keepalive, "TTL"), "3");
  EXPECT_EQ(internal::JsonField(R"({"header":{},"succeeded":true})", "succeeded"), "true");
  EXPECT_EQ(internal::JsonField(R"({"header":{"revision":"3"}})", "kvs"), std::nullopt);
  const std::string range = R"({"kvs":[{"key":"a2V5","value":"MTI3LjAuMC4xOjU=","lease":"9"}]})";
  EXPECT_EQ(internal::JsonField(range, "value", range.find("\"kvs\"")), "MTI3LjAuMC4xOjU=");
}

}  // namespace
}  // namespace mc::master
