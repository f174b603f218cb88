// Promotion of SSD hits back to memory: PromoteStart / PromoteEnd.
#include <gtest/gtest.h>

#include "master/grpc_service.h"
#include "tests/unit/master/master_test_util.h"

namespace mc::master {
namespace {

using testing::CodeOf;
using testing::MasterFixture;

class Promotion : public ::testing::Test {
 protected:
  void SetUp() override {
    m_.Register("c1", {1 << 20}, 1 << 30);
    m_.Register("c2", {1 << 20});
    // An object that lives only on c1's SSD tier.
    gen_ = m_.Put("c1", "k", 1000);
    ASSERT_TRUE(m_.svc().AddDiskReplicas("c1", {{"k", gen_, 7, 1000, 42}}, false)[0].ok());
    DropMemoryReplica();
  }
  void DropMemoryReplica() {
    // Fill memory so the evictor drops k's memory replica (it is persisted, so preferred).
    for (int i = 0; i < 2100; ++i) m_.Put("c1", "fill" + std::to_string(i), 1000);
    LookupBatch b = m_.svc().GetReplicas({"k"}, {.grant_lease = false});
    ASSERT_TRUE(b.results[0].status.ok());
    ASSERT_EQ(b.results[0].replicas.size(), 1u);
    ASSERT_EQ(b.results[0].replicas[0].tier, ReplicaTier::kDisk);
    // Free some room so promotions need no eviction (which would blur the space accounting).
    for (int i = 1800; i < 2100; ++i) m_.svc().Remove({"fill" + std::to_string(i)});
  }
  std::vector<ReplicaTier> Tiers() {
    LookupBatch b = m_.svc().GetReplicas({"k"}, {.grant_lease = false});
    std::vector<ReplicaTier> out;
    for (const auto& r : b.results[0].replicas) out.push_back(r.tier);
    return out;
  }
  MasterFixture m_;
  uint64_t gen_ = 0;
};

TEST_F(Promotion, WrittenPromotionAddsAMemoryReplicaFirst) {
  auto started = m_.svc().PromoteStart("c2", {{"k", gen_}});
  ASSERT_TRUE(started[0].status.ok()) << started[0].status;
  ASSERT_EQ(started[0].replicas.size(), 1u);
  EXPECT_EQ(started[0].replicas[0].tier, ReplicaTier::kMemory);
  // Not readable from memory until PromoteEnd.
  EXPECT_EQ(Tiers(), std::vector<ReplicaTier>{ReplicaTier::kDisk});
  ASSERT_TRUE(m_.svc().PromoteEnd("c2", {{"k", gen_}}, {true})[0].ok());
  EXPECT_EQ(Tiers(), (std::vector<ReplicaTier>{ReplicaTier::kMemory, ReplicaTier::kDisk}));
}

TEST_F(Promotion, TheGrpcAnswerListsMemoryReplicasFirstWhateverTheStoredOrder) {
  ASSERT_TRUE(m_.svc().PromoteStart("c2", {{"k", gen_}})[0].status.ok());
  ASSERT_TRUE(m_.svc().PromoteEnd("c2", {{"k", gen_}}, {true})[0].ok());
  // The promotion appended the memory replica after the DISK one; readers try replicas in the
  // order the master answers, and memory must come first.
  MasterGrpcService grpc(m_.svc(), m_.metrics(), 1000);
  for (bool lease : {false, true}) {
    mcstore::v1::GetReplicasRequest req;
    req.set_client_id("c2");
    req.add_keys("k");
    req.add_keys("missing");
    req.set_no_lease(!lease);
    mcstore::v1::GetReplicasResponse resp;
    ASSERT_TRUE(grpc.DoGetReplicas(Caller{}, &req, &resp).ok());
    ASSERT_EQ(resp.results_size(), 2);
    const auto& k = resp.results(0);
    ASSERT_EQ(k.code(), mcstore::v1::OK) << k.message();
    EXPECT_EQ(k.generation(), gen_);
    ASSERT_EQ(k.replicas_size(), 2);
    EXPECT_EQ(k.replicas(0).tier(), mcstore::v1::MEMORY);
    EXPECT_EQ(k.replicas(0).client_id(), "c2");
    EXPECT_EQ(k.replicas(1).tier(), mcstore::v1::DISK);
    EXPECT_EQ(k.replicas(1).client_id(), "c1");
    EXPECT_EQ(resp.results(1).code(), mcstore::v1::NOT_FOUND);
    EXPECT_EQ(resp.results(1).replicas_size(), 0);
  }
  // A prefix lookup answers up to and including the first miss, nothing after it.
  m_.Put("c2", "after", 100);
  mcstore::v1::GetReplicasRequest prefix;
  prefix.set_client_id("c2");
  for (const char* key : {"k", "missing", "after"}) prefix.add_keys(key);
  prefix.set_stop_at_first_miss(true);
  mcstore::v1::GetReplicasResponse resp;
  ASSERT_TRUE(grpc.DoGetReplicas(Caller{}, &prefix, &resp).ok());
  EXPECT_EQ(resp.matched(), 1u);
  ASSERT_EQ(resp.results_size(), 2);
  EXPECT_EQ(resp.results(0).replicas(0).tier(), mcstore::v1::MEMORY);
  EXPECT_EQ(resp.results(1).code(), mcstore::v1::NOT_FOUND);
}

TEST_F(Promotion, UnwrittenPromotionGivesTheSpaceBack) {
  uint64_t used = m_.svc().Snapshot().mem_used;
  ASSERT_TRUE(m_.svc().PromoteStart("c2", {{"k", gen_}})[0].status.ok());
  EXPECT_GT(m_.svc().Snapshot().mem_used, used);
  ASSERT_TRUE(m_.svc().PromoteEnd("c2", {{"k", gen_}}, {false})[0].ok());
  EXPECT_EQ(m_.svc().Snapshot().mem_used, used);
  EXPECT_EQ(Tiers(), std::vector<ReplicaTier>{ReplicaTier::kDisk});
}

TEST_F(Promotion, SecondPromotionOrWrongGenerationIsRefused) {
  ASSERT_TRUE(m_.svc().PromoteStart("c2", {{"k", gen_}})[0].status.ok());
  EXPECT_EQ(CodeOf(m_.svc().PromoteStart("c1", {{"k", gen_}})[0].status), Code::kAlreadyExists);
  EXPECT_EQ(CodeOf(m_.svc().PromoteStart("c1", {{"k", gen_ + 1}})[0].status), Code::kNotFound);
  EXPECT_EQ(CodeOf(m_.svc().PromoteEnd("c1", {{"k", gen_}}, {true})[0]), Code::kNotFound);
}

TEST_F(Promotion, RemoveDuringPromotionFreesItsSpace) {
  uint64_t used = m_.svc().Snapshot().mem_used;
  ASSERT_TRUE(m_.svc().PromoteStart("c2", {{"k", gen_}})[0].status.ok());
  ASSERT_TRUE(m_.svc().Remove({"k"})[0].ok());
  EXPECT_EQ(m_.svc().Snapshot().mem_used, used);
  EXPECT_EQ(CodeOf(m_.svc().PromoteEnd("c2", {{"k", gen_}}, {true})[0]), Code::kNotFound);
}

TEST_F(Promotion, TimedOutPromotionIsRevoked) {
  uint64_t used = m_.svc().Snapshot().mem_used;
  ASSERT_TRUE(m_.svc().PromoteStart("c2", {{"k", gen_}})[0].status.ok());
  m_.clock().AdvanceMs(m_.svc().options().put_timeout_ms + 1);
  m_.HeartbeatAll();
  m_.svc().RunMaintenance();
  EXPECT_EQ(m_.svc().Snapshot().mem_used, used);
  EXPECT_EQ(CodeOf(m_.svc().PromoteEnd("c2", {{"k", gen_}}, {true})[0]), Code::kNotFound);
  EXPECT_EQ(Tiers(), std::vector<ReplicaTier>{ReplicaTier::kDisk});
}

TEST_F(Promotion, NeverEvictsTheOnlyCopyOfAnotherObject) {
  // Memory full of objects that exist nowhere else: a promotion must not push one out.
  for (int i = 0; i < 3000; ++i) m_.Put(i % 2 ? "c1" : "c2", "mem" + std::to_string(i), 1000);
  const size_t keys = m_.svc().KeyCount();
  const uint64_t evicted = m_.svc().Snapshot().eviction.evicted_keys;
  auto started = m_.svc().PromoteStart("c2", {{"k", gen_}});
  EXPECT_EQ(CodeOf(started[0].status), Code::kNoSpace) << started[0].status;
  EXPECT_EQ(m_.svc().KeyCount(), keys);
  EXPECT_EQ(m_.svc().Snapshot().eviction.evicted_keys, evicted);
}

// Nor indirectly: a promotion that would fill memory past the high watermark is refused, because
// the background pass would then evict the coldest objects, only copies included.
TEST_F(Promotion, NeverFillsMemoryPastTheHighWatermark) {
  const MasterSnapshot before = m_.svc().Snapshot();
  const auto limit = static_cast<uint64_t>(m_.svc().options().eviction.high_watermark *
                                           static_cast<double>(before.mem_capacity));
  // Memory-only objects up to just under the high watermark: room for k, but not below it.
  for (int i = 0; m_.svc().Snapshot().mem_used + 1024 <= limit; ++i) {
    m_.Put("c2", "only" + std::to_string(i), 1000);
  }
  ASSERT_LE(m_.svc().Snapshot().mem_used, limit);
  // The fill objects left by SetUp are memory-only too: nothing persisted to evict but k itself.
  const size_t keys = m_.svc().KeyCount();
  auto started = m_.svc().PromoteStart("c2", {{"k", gen_}});
  EXPECT_EQ(CodeOf(started[0].status), Code::kNoSpace) << started[0].status;
  m_.HeartbeatAll();
  m_.svc().RunMaintenance();
  EXPECT_EQ(m_.svc().KeyCount(), keys) << "the background pass evicted something";
  EXPECT_EQ(m_.svc().Snapshot().eviction.evicted_keys, before.eviction.evicted_keys);
}

}  // namespace
}  // namespace mc::master
