// OffloadPlanner on its own (object table, segment manager, queue, FakeClock): what it queues
// (cold, COMPLETE, memory-only objects on disk-capable clients, above the watermark), how much
// (max pending per client, scan limit), and when a task is queued again (task timeout).
#include "master/offload_planner.h"

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "gtest/gtest.h"
#include "master/object_table.h"
#include "master/segment_manager.h"
#include "tests/fakes/fake_clock.h"

namespace mc::master {
namespace {

constexpr uint64_t kSegment = 100 * 1024;
constexpr uint64_t kObject = 1024;

class OffloadPlannerTest : public ::testing::Test {
 protected:
  OffloadPlannerTest() : table_(/*shard_count=*/1) {
    seg_disk_ = segments_.AddSegment("disk", "10.0.0.1:1", kSegment);
    seg_nodisk_ = segments_.AddSegment("nodisk", "10.0.0.2:1", kSegment);
  }

  std::unique_ptr<OffloadPlanner> MakePlanner(OffloadPlannerOptions o) {
    return std::make_unique<OffloadPlanner>(
        table_, segments_, queue_, [](const std::string& c) { return c == "disk"; }, clock_,
        metrics_, o);
  }
  static OffloadPlannerOptions Options() {
    OffloadPlannerOptions o;
    o.watermark = 0.0;  // always above, unless a test says otherwise
    o.max_pending_per_client = 1000;
    o.scan_limit_per_shard = 1000;
    o.task_timeout_ms = 10'000;
    return o;
  }

  // Allocates memory for an object on `client` and inserts it (state, extra replicas as given).
  // Objects inserted later are more recent (LRU front).
  void Add(const std::string& key, const std::string& client,
           ObjectState state = ObjectState::kComplete, bool disk_replica = false,
           const std::string& second_client = "") {
    Object o;
    o.size = kObject;
    o.checksum = 0xC0FFEE00 + key.size();
    o.generation = ++generation_;
    o.state = state;
    for (const std::string& c : {client, second_client}) {
      if (c.empty()) continue;
      auto placed = segments_.Place(kObject, 1, c);
      ASSERT_TRUE(placed.ok()) << placed.status();
      ASSERT_EQ((*placed)[0].client_id, c);
      o.replicas.push_back(StoredReplica::Of(ReplicaTier::kMemory, (*placed)[0]));
    }
    if (disk_replica) {
      o.replicas.push_back(StoredReplica::Of(
          ReplicaTier::kDisk, MemoryLocation{"disk", "10.0.0.1:1", 0, 4096, kObject}));
    }
    generations_[key] = o.generation;
    table_.ForKeys({key}, [&](ObjectTable::Shard& shard, const std::vector<size_t>&) {
      shard.mu.AssertHeld();
      shard.Insert(key, std::move(o));
    });
  }

  std::vector<std::string> TakeKeys(const std::string& client, size_t max = 1000) {
    std::vector<std::string> keys;
    for (const OffloadTask& t : queue_.Take(client, max)) keys.push_back(t.key);
    return keys;
  }

  FakeClock clock_;
  MetricsRegistry metrics_;
  ObjectTable table_;
  SegmentManager segments_;
  OffloadQueue queue_;
  uint64_t seg_disk_ = 0, seg_nodisk_ = 0;
  uint64_t generation_ = 1000;
  std::map<std::string, uint64_t> generations_;
};

TEST_F(OffloadPlannerTest, BelowWatermarkQueuesNothing) {
  OffloadPlannerOptions o = Options();
  o.watermark = 0.2;  // of 200 KiB: 40 KiB
  auto planner = MakePlanner(o);
  for (int i = 0; i < 40; ++i) Add("k" + std::to_string(i), "disk");  // exactly at, not above
  EXPECT_EQ(planner->Plan(), 0u);
  EXPECT_EQ(queue_.Pending("disk"), 0u);
  // Past the watermark: planned.
  for (int i = 40; i < 50; ++i) Add("k" + std::to_string(i), "disk");
  EXPECT_EQ(planner->Plan(), 50u);
  EXPECT_EQ(metrics_.GetCounter("mc_offloads_planned_total", "").Value(), 50u);
}

TEST_F(OffloadPlannerTest, QueuesOnlyCompleteMemoryOnlyObjectsOfDiskCapableClients) {
  auto planner = MakePlanner(Options());
  Add("complete", "disk");
  Add("pending", "disk", ObjectState::kPending);
  Add("persisted", "disk", ObjectState::kComplete, /*disk_replica=*/true);
  Add("on-nodisk", "nodisk");
  Add("both", "nodisk", ObjectState::kComplete, false, /*second_client=*/"disk");
  EXPECT_EQ(planner->Plan(), 2u);
  EXPECT_EQ(queue_.Pending("nodisk"), 0u);
  std::vector<OffloadTask> tasks = queue_.Take("disk", 100);
  ASSERT_EQ(tasks.size(), 2u);
  std::set<std::string> keys;
  for (const OffloadTask& t : tasks) {
    keys.insert(t.key);
    EXPECT_EQ(t.kind, OffloadTask::Kind::kOffload);
    EXPECT_EQ(t.generation, generations_[t.key]);
    EXPECT_EQ(t.size, kObject);
    EXPECT_EQ(t.checksum, 0xC0FFEE00 + t.key.size());
    // The task names the memory replica on the disk-capable client.
    EXPECT_EQ(t.segment_id, seg_disk_) << t.key;
  }
  EXPECT_EQ(keys, (std::set<std::string>{"complete", "both"}));
}

TEST_F(OffloadPlannerTest, ColdestObjectsFirstWithinTheScanLimit) {
  OffloadPlannerOptions o = Options();
  o.scan_limit_per_shard = 3;
  auto planner = MakePlanner(o);
  for (int i = 0; i < 10; ++i) {
    Add("k" + std::to_string(i), "disk");
    clock_.AdvanceMs(1);
  }
  EXPECT_EQ(planner->Plan(), 3u);
  EXPECT_EQ(TakeKeys("disk"), (std::vector<std::string>{"k0", "k1", "k2"}));
}

TEST_F(OffloadPlannerTest, RespectsMaxPendingPerClient) {
  OffloadPlannerOptions o = Options();
  o.max_pending_per_client = 4;
  auto planner = MakePlanner(o);
  for (int i = 0; i < 10; ++i) Add("k" + std::to_string(i), "disk");
  EXPECT_EQ(planner->Plan(), 4u);
  EXPECT_EQ(queue_.Pending("disk"), 4u);
  // Nothing taken: the queue is full, nothing more is planned.
  EXPECT_EQ(planner->Plan(), 0u);
  EXPECT_EQ(queue_.Pending("disk"), 4u);
  // Two taken: room for two more, and only objects not already in flight.
  std::vector<std::string> first = TakeKeys("disk", 2);
  EXPECT_EQ(planner->Plan(), 2u);
  std::vector<std::string> rest = TakeKeys("disk");
  ASSERT_EQ(rest.size(), 4u);
  std::set<std::string> all(first.begin(), first.end());
  all.insert(rest.begin(), rest.end());
  EXPECT_EQ(all.size(), 6u) << "no key queued twice while in flight";
}

TEST_F(OffloadPlannerTest, RequeuesAfterTaskTimeout) {
  auto planner = MakePlanner(Options());
  Add("k", "disk");
  EXPECT_EQ(planner->Plan(), 1u);
  EXPECT_EQ(TakeKeys("disk"), std::vector<std::string>{"k"});
  // Taken but never reported: in flight until the timeout.
  EXPECT_EQ(planner->Plan(), 0u);
  clock_.AdvanceMs(9'999);
  EXPECT_EQ(planner->Plan(), 0u);
  clock_.AdvanceMs(1);
  EXPECT_EQ(planner->Plan(), 1u);
  EXPECT_EQ(TakeKeys("disk"), std::vector<std::string>{"k"});
}

// Expired offload marks (a task never reported, a failure past the retry time) are dropped
// when the planner walks the object, so its side record goes once nothing else is in it.
TEST_F(OffloadPlannerTest, ExpiredOffloadMarksAreCleared) {
  auto planner = MakePlanner(Options());
  Add("failed", "disk");
  Add("nodisk", "nodisk");
  auto with = [&](const std::string& key,
                  const std::function<void(ObjectTable::Shard&, const Object&)>& fn) {
    table_.ForKeys({key}, [&](ObjectTable::Shard& shard, const std::vector<size_t>&) {
      shard.mu.AssertHeld();
      auto it = shard.objects.find(key);
      ASSERT_NE(it, shard.objects.end());
      fn(shard, it->second);
    });
  };
  for (const std::string key : {"failed", "nodisk"}) {
    with(key, [&](ObjectTable::Shard& shard, const Object& o) {
      shard.mu.AssertHeld();
      shard.MarkOffloadFailed(o, clock_.NowMs());
    });
  }
  EXPECT_EQ(planner->Plan(), 0u) << "a fresh failure holds the object back";
  with("failed", [](ObjectTable::Shard&, const Object& o) { EXPECT_TRUE(o.has_transient()); });
  clock_.AdvanceMs(10'000);
  EXPECT_EQ(planner->Plan(), 1u) << "past the timeout it is tried again";
  with("failed", [](ObjectTable::Shard&, const Object& o) {
    EXPECT_EQ(o.offload_failed_ms(), 0);
    EXPECT_NE(o.offload_queued_ms(), 0);
  });
  with("nodisk", [](ObjectTable::Shard&, const Object& o) {
    EXPECT_FALSE(o.has_transient()) << "nothing left in it";
  });
  // The task is never reported: past the timeout the mark goes and the object is queued again.
  EXPECT_EQ(TakeKeys("disk"), std::vector<std::string>{"failed"});
  clock_.AdvanceMs(10'000);
  EXPECT_EQ(planner->Plan(), 1u);
  with("failed", [&](ObjectTable::Shard&, const Object& o) {
    EXPECT_EQ(o.offload_queued_ms(), clock_.NowMs());
  });
}

TEST(OffloadQueue, FifoPerClientAndDropClientForgetsTheQueue) {
  OffloadQueue q;
  for (int i = 0; i < 3; ++i)
    q.Push("a", OffloadTask{OffloadTask::Kind::kOffload, "a" + std::to_string(i)});
  q.Push("b", OffloadTask{OffloadTask::Kind::kDrop, "b0"});
  std::vector<OffloadTask> two = q.Take("a", 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].key, "a0");
  EXPECT_EQ(two[1].key, "a1");
  EXPECT_EQ(q.Pending("a"), 1u);
  EXPECT_EQ(q.DropClient("a").size(), 1u);
  EXPECT_EQ(q.Pending("a"), 0u);
  EXPECT_TRUE(q.Take("a", 10).empty());
  EXPECT_EQ(q.Take("b", 10).size(), 1u);
}

}  // namespace
}  // namespace mc::master
