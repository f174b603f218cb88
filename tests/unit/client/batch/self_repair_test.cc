// Self-repair in the batch paths (DESIGN.md invariant 10), against the in-process master: a
// replica that fails its checksum is re-read into private memory, reported and dropped, and the
// get falls back within the same call; a last bad replica takes its key, which can then be stored
// again; a holder that refuses connections is reported, skipped by later gets without being
// dialled, and placed around by puts.
#include <memory>
#include <string>
#include <vector>

#include "client/batch/holder_backoff.h"
#include "gtest/gtest.h"
#include "tests/unit/client/client_test_util.h"

namespace mc::client::testing {
namespace {

class SelfRepair : public ClientFixture {
 protected:
  void SetUp() override {
    ClientFixture::SetUp();
    getter_.SetHolderBackoff(&backoff_);
    putter_.SetHolderBackoff(&backoff_);
  }

  // A client served over loopback TCP (like StartRemote), `size` bytes of one segment.
  struct Remote {
    transfer::SegmentTable table;
    std::unique_ptr<FakeSegments> segments;
    std::unique_ptr<transfer::tcp::TcpDataServer> server;
  };
  std::unique_ptr<Remote> AddRemote(const std::string& id, uint64_t size) {
    auto r = std::make_unique<Remote>();
    transfer::tcp::TcpDataServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.socket_buffers = {.send_bytes = 1 << 20, .receive_bytes = 1 << 20};
    r->server = std::make_unique<transfer::tcp::TcpDataServer>(o, r->table);
    EXPECT_TRUE(r->server->Start().ok());
    r->segments = Register(id, r->server->endpoint(), r->table, 1, size);
    return r;
  }

  std::vector<std::string> Holders(const std::string& key) {
    std::vector<std::string> out;
    const v1::KeyReplicas found = Lookup(key);
    for (const auto& rep : found.replicas()) out.push_back(rep.client_id());
    return out;
  }

  GetItemResult GetOne(const std::string& key, std::string* data) {
    std::vector<GetRequestItem> items{InlineItem(key)};
    StringSink sink(1);
    std::vector<GetItemResult> r = getter_.Get(items, 0, &sink);
    *data = sink.data(0);
    return r[0];
  }

  uint64_t MasterCounter(const std::string& name, const Labels& labels = {}) {
    return master_.metrics().GetCounter(name, "", labels).Value();
  }

  HolderBackoff backoff_{clock_, 2000};
};

TEST_F(SelfRepair, ACorruptReplicaIsDroppedAndTheGetFallsBackInTheSameCall) {
  auto b = AddRemote("client-b", 1 << 20);
  const std::string v = Payload(5000, 1);
  PutOk("k", v, 2);
  ASSERT_EQ(Holders("k"), (std::vector<std::string>{kLocalId, "client-b"}));
  ASSERT_TRUE(Scribble("k", *local_));

  std::string got;
  GetItemResult r = GetOne("k", &got);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(got, v);
  EXPECT_EQ(metrics_.faults_reported_corrupt.Value(), 1u);
  EXPECT_EQ(Holders("k"), std::vector<std::string>{"client-b"}) << "the bad replica is gone";
  EXPECT_EQ(MasterCounter("mc_replicas_dropped_total", {{"tier", "memory"}, {"reason", "corrupt"}}),
            1u);
  // The next get reads the good replica first: no mismatch, nothing reported.
  const uint64_t mismatches = metrics_.checksum_mismatches.Value();
  ASSERT_TRUE(GetOne("k", &got).status.ok());
  EXPECT_EQ(metrics_.checksum_mismatches.Value(), mismatches);
  EXPECT_EQ(metrics_.faults_reported_corrupt.Value(), 1u);
}

TEST_F(SelfRepair, ALastCorruptReplicaTakesItsKeySoTheNextPutStoresItAgain) {
  const std::string v = Payload(3000, 2);
  PutOk("k", v);
  ASSERT_TRUE(Scribble("k", *local_, 100));
  std::string got;
  EXPECT_EQ(CodeOf(GetOne("k", &got).status), Code::kChecksumMismatch);
  EXPECT_EQ(Lookup("k").code(), v1::NOT_FOUND) << "its last replica was bad: the key is gone";
  // Before self-repair the recomputed block was refused ALREADY_EXISTS for ever.
  PutOk("k", v);
  GetItemResult r = GetOne("k", &got);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(got, v);
  EXPECT_EQ(MasterCounter("mc_objects_lost_total", {{"reason", "corrupt"}}), 1u);
}

TEST_F(SelfRepair, ARefusingHolderIsReportedAndSkippedWithoutBeingDialledAgain) {
  // Placement by free space: c (larger) gets the second replica, b the third.
  auto b = AddRemote("client-b", 1 << 20);
  auto c = AddRemote("client-c", 4 << 20);
  const std::string v1 = Payload(4000, 3), v2 = Payload(4000, 4);
  PutOk("k1", v1, 3);
  PutOk("k2", v2, 3);
  ASSERT_EQ(Holders("k1"), (std::vector<std::string>{kLocalId, "client-c", "client-b"}));
  const std::string c_endpoint = c->server->endpoint();
  c->server->Stop();  // client-c's daemon is gone: its port refuses connections
  ASSERT_TRUE(Scribble("k1", *local_));
  ASSERT_TRUE(Scribble("k2", *local_));

  std::string got;
  GetItemResult r = GetOne("k1", &got);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(got, v1) << "read from client-b after client-c refused";
  EXPECT_TRUE(backoff_.BackingOff(c_endpoint));
  EXPECT_EQ(metrics_.faults_reported_unreachable.Value(), 1u);
  // The master was told; client-c's registration is fresh, so it is not dropped on a report.
  EXPECT_EQ(MasterCounter("mc_master_fault_reports_refused_total"), 1u);

  const uint64_t skips = metrics_.holder_backoff_skips.Value();
  r = GetOne("k2", &got);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(got, v2);
  EXPECT_EQ(metrics_.holder_backoff_skips.Value(), skips + 1) << "client-c was not dialled";
  EXPECT_EQ(metrics_.faults_reported_unreachable.Value(), 1u) << "reported once per back-off";
}

TEST_F(SelfRepair, APutPlacesAroundAHolderThatRefusedIt) {
  auto b = AddRemote("client-b", 1 << 20);
  auto c = AddRemote("client-c", 4 << 20);  // the master's first choice after the writer
  c->server->Stop();
  const std::string v = Payload(2000, 5);
  PutOk("k", v, 2);
  EXPECT_EQ(Holders("k"), (std::vector<std::string>{kLocalId, "client-b"}));
  EXPECT_EQ(metrics_.put_unreachable_retries.Value(), 1u);
  EXPECT_EQ(metrics_.faults_reported_unreachable.Value(), 1u);
  EXPECT_TRUE(backoff_.BackingOff(c->server->endpoint()));
  std::string got;
  ASSERT_TRUE(GetOne("k", &got).status.ok());
  EXPECT_EQ(got, v);
}

TEST_F(SelfRepair, BackoffEndsAndIsBounded) {
  HolderBackoff backoff(clock_, 100);
  EXPECT_TRUE(backoff.Refused("h:1"));
  EXPECT_FALSE(backoff.Refused("h:1")) << "already backing off: not reported again";
  EXPECT_TRUE(backoff.BackingOff("h:1"));
  clock_.AdvanceMs(100);
  EXPECT_FALSE(backoff.BackingOff("h:1"));
  EXPECT_TRUE(backoff.Refused("h:1"));
  for (size_t i = 0; i < HolderBackoff::kMaxEndpoints + 10; ++i) {
    backoff.Refused("e:" + std::to_string(i));
  }
  EXPECT_LE(backoff.CountForTest(), HolderBackoff::kMaxEndpoints);
  HolderBackoff off(clock_, 0);
  EXPECT_TRUE(off.Refused("h:1"));
  EXPECT_FALSE(off.BackingOff("h:1"));
}

}  // namespace
}  // namespace mc::client::testing
