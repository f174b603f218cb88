// Write-back through MetadataService (DESIGN.md invariant 7): an acknowledged object whose memory
// replica sits on a client with an SSD tier leaves memory only once a DISK replica is reported;
// until then PutStart answers NO_SPACE with write_back_pending (and plans the offloads at once).
// Objects no tier can take (no SSD tier, or the offload reported failed) may go, counted in
// mc_objects_lost_total; so are SSD records reclaimed as last copies and corrupt records.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/master/master_test_util.h"

namespace mc::master {
namespace {

using testing::CodeOf;
using testing::MasterFixture;

constexpr uint64_t kObject = 4096;  // 16 of them: the smallest segment a client may register
constexpr uint64_t kSlots = 16;     // the segment holds exactly this many objects

std::string Key(int i) { return "key-" + std::to_string(i); }

class WriteBack : public ::testing::Test {
 protected:
  void SetUp() override {
    session_ = m_.Register("c1", {kObject * kSlots}, /*disk_capacity=*/1 << 30);
    for (int i = 0; i < static_cast<int>(kSlots); ++i) {
      generations_.push_back(m_.Put("c1", Key(i), kObject));
      m_.clock().AdvanceMs(1);
    }
  }
  uint64_t Lost(const std::string& reason) {
    return m_.CounterValue("mc_objects_lost_total", {{"reason", reason}});
  }
  // Reports a DISK replica of key i on c1 (as the offload driver does after writing it).
  void Persist(int i) {
    ASSERT_TRUE(m_.svc()
                    .AddDiskReplicas(
                        "c1", {{Key(i), generations_[i], 4096u * (i + 1), kObject, 42}}, false)[0]
                    .ok());
  }

  MasterFixture m_;
  uint64_t session_ = 0;
  std::vector<uint64_t> generations_;
};

TEST_F(WriteBack, FullMemoryOfUnpersistedObjectsWaitsForWriteBack) {
  PutStartOutcome o = m_.Start("c1", "new", kObject);
  EXPECT_EQ(CodeOf(o.status), Code::kNoSpace);
  EXPECT_TRUE(o.write_back_pending) << o.status;
  EXPECT_FALSE(o.no_space_final);
  EXPECT_EQ(m_.CounterValue("mc_put_write_back_waits_total"), 1u);
  EXPECT_EQ(m_.CounterValue("mc_put_no_space_total"), 0u);
  for (int i = 0; i < static_cast<int>(kSlots); ++i) EXPECT_TRUE(m_.Exists(Key(i))) << i;
  // The refusal planned the write-back of every waiting object at once, not at the next
  // maintenance pass.
  auto tasks = m_.svc().TakeOffloadTasks("c1", session_, 100);
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  EXPECT_EQ(tasks->size(), kSlots);
  // The background pass does not drop them either.
  m_.svc().RunMaintenance();
  for (int i = 0; i < static_cast<int>(kSlots); ++i) EXPECT_TRUE(m_.Exists(Key(i))) << i;
  EXPECT_EQ(Lost("evicted_unpersisted"), 0u);
}

TEST_F(WriteBack, PersistedObjectLeavesMemoryAndStaysReadable) {
  Persist(3);
  PutStartOutcome o = m_.Start("c1", "new", kObject);
  ASSERT_TRUE(o.status.ok()) << o.status;
  LookupBatch b = m_.svc().GetReplicas({Key(3)}, {.grant_lease = false});
  ASSERT_TRUE(b.results[0].status.ok());
  ASSERT_EQ(b.results[0].replicas.size(), 1u);
  EXPECT_EQ(b.results[0].replicas[0].tier, ReplicaTier::kDisk);
  for (int i = 0; i < static_cast<int>(kSlots); ++i) EXPECT_TRUE(m_.Exists(Key(i))) << i;
  EXPECT_EQ(Lost("evicted_unpersisted"), 0u);
}

TEST_F(WriteBack, ReportedOffloadFailureLetsTheObjectGoCounted) {
  ASSERT_TRUE(
      m_.svc().AddDiskReplicas("c1", {}, false, {{Key(5), generations_[5], 0, 0, 0}}).empty());
  EXPECT_EQ(m_.CounterValue("mc_offload_failures_reported_total"), 1u);
  PutStartOutcome o = m_.Start("c1", "new", kObject);
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_FALSE(m_.Exists(Key(5)));
  EXPECT_EQ(Lost("evicted_unpersisted"), 1u);
  EXPECT_NE(m_.svc().StatusLine().find("Lost: 1 (evicted unpersisted 1, SSD reclaimed 0)"),
            std::string::npos)
      << m_.svc().StatusLine();
  // The planner does not ask for it again while the failure is recent.
  auto tasks = m_.svc().TakeOffloadTasks("c1", session_, 100);
  ASSERT_TRUE(tasks.ok());
  for (const OffloadTask& t : *tasks) EXPECT_NE(t.key, Key(5));
}

TEST_F(WriteBack, FailureOfAnotherGenerationChangesNothing) {
  m_.svc().AddDiskReplicas("c1", {}, false, {{Key(5), generations_[5] + 1000, 0, 0, 0}});
  PutStartOutcome o = m_.Start("c1", "new", kObject);
  EXPECT_TRUE(o.write_back_pending);
  EXPECT_TRUE(m_.Exists(Key(5)));
}

TEST(WriteBackMemoryOnly, ClientWithoutSsdTierEvictsAndCountsTheLoss) {
  MasterFixture m;
  m.Register("c1", {kObject * kSlots});
  for (int i = 0; i < static_cast<int>(kSlots) + 4; ++i) m.Put("c1", Key(i), kObject);
  EXPECT_EQ(m.CounterValue("mc_objects_lost_total", {{"reason", "evicted_unpersisted"}}), 4u);
  EXPECT_EQ(m.CounterValue("mc_put_write_back_waits_total"), 0u);
}

TEST_F(WriteBack, SsdReclaimOfTheLastCopyIsCounted) {
  Persist(0);
  ASSERT_TRUE(m_.Start("c1", "new", kObject).status.ok());  // key-0 now only on SSD
  std::vector<absl::Status> r =
      m_.svc().RemoveDiskReplicas("c1", {{Key(0), generations_[0], 4096, kObject, 0}});
  ASSERT_TRUE(r[0].ok()) << r[0];
  EXPECT_FALSE(m_.Exists(Key(0)));
  EXPECT_EQ(Lost("ssd_reclaimed"), 1u);
}

TEST_F(WriteBack, CorruptRecordIsDroppedDespiteLeases) {
  Persist(0);
  ASSERT_TRUE(m_.Start("c1", "new", kObject).status.ok());  // key-0 now only on SSD
  LookupBatch b = m_.svc().GetReplicas({Key(0)}, {.grant_lease = true});
  ASSERT_TRUE(b.results[0].status.ok());
  const std::string key0 = Key(0);
  DiskReplicaItem item{key0, generations_[0], 4096, kObject, 0};
  EXPECT_EQ(CodeOf(m_.svc().RemoveDiskReplicas("c1", {item})[0]), Code::kHasLease);
  EXPECT_TRUE(m_.svc().RemoveDiskReplicas("c1", {item}, /*corrupt=*/true)[0].ok());
  EXPECT_FALSE(m_.Exists(Key(0)));
  EXPECT_EQ(m_.CounterValue("mc_disk_replicas_corrupt_total"), 1u);
  EXPECT_EQ(Lost("corrupt"), 1u);
}

}  // namespace
}  // namespace mc::master
