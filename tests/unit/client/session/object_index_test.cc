// ObjectIndex: inserts replace what they overlap, forget and erase, bounds, the size gauge.
#include "client/session/object_index.h"

#include <optional>
#include <thread>

#include "common/status.h"
#include "gtest/gtest.h"

namespace mc::client {
namespace {

IndexedObject Obj(const std::string& key, uint64_t size, uint64_t generation = 1) {
  return {key, generation, size, 0xC0FFEE ^ generation};
}

std::vector<std::string> Keys(const ObjectIndex& index) {
  std::vector<std::string> out;
  for (const auto& e : index.Snapshot()) out.push_back(e.object.key);
  return out;
}

TEST(ObjectIndex, SnapshotListsEntriesBySegmentThenOffset) {
  MetricsRegistry metrics;
  Gauge& gauge = metrics.GetGauge("objects", "");
  ObjectIndex index({1000, 1000}, &gauge);
  ASSERT_TRUE(index.Insert(1, 0, Obj("c", 10)).ok());
  ASSERT_TRUE(index.Insert(0, 500, Obj("b", 10)).ok());
  ASSERT_TRUE(index.Insert(0, 0, Obj("a", 10)).ok());
  EXPECT_EQ(Keys(index), (std::vector<std::string>{"a", "b", "c"}));
  std::vector<ObjectIndex::Entry> snap = index.Snapshot();
  EXPECT_EQ(snap[1].local_index, 0u);
  EXPECT_EQ(snap[1].offset, 500u);
  EXPECT_EQ(snap[2].local_index, 1u);
  EXPECT_EQ(index.size(), 3u);
  EXPECT_EQ(gauge.Value(), 3);
}

TEST(ObjectIndex, InsertRemovesEveryOverlappedEntry) {
  ObjectIndex index({1000});
  ASSERT_TRUE(index.Insert(0, 0, Obj("before", 100)).ok());   // [0,100) reaches into new
  ASSERT_TRUE(index.Insert(0, 100, Obj("inside", 50)).ok());  // [100,150)
  ASSERT_TRUE(index.Insert(0, 180, Obj("tail", 100)).ok());   // [180,280) starts inside
  ASSERT_TRUE(index.Insert(0, 300, Obj("after", 10)).ok());   // [300,310) untouched
  ASSERT_TRUE(index.Insert(0, 90, Obj("new", 100, 2)).ok());  // [90,190)
  EXPECT_EQ(Keys(index), (std::vector<std::string>{"new", "after"}));
  EXPECT_EQ(index.size(), 2u);
  // Adjacent ranges do not overlap.
  ASSERT_TRUE(index.Insert(0, 190, Obj("adjacent", 110)).ok());  // [190,300)
  EXPECT_EQ(Keys(index), (std::vector<std::string>{"new", "adjacent", "after"}));
  // The same offset again: the newer object replaces the older.
  ASSERT_TRUE(index.Insert(0, 90, Obj("newer", 10, 3)).ok());
  EXPECT_EQ(Keys(index), (std::vector<std::string>{"newer", "adjacent", "after"}));
}

TEST(ObjectIndex, FindFollowsEveryChangeOfAKeysEntry) {
  ObjectIndex index({1000, 1000});
  EXPECT_FALSE(index.Find("a").has_value());
  ASSERT_TRUE(index.Insert(0, 100, Obj("a", 10, 1)).ok());
  std::optional<ObjectIndex::Entry> e = index.Find("a");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->local_index, 0u);
  EXPECT_EQ(e->offset, 100u);
  EXPECT_EQ(e->object.generation, 1u);
  // A later replica of the same key is the one found; dropping the earlier keeps it.
  ASSERT_TRUE(index.Insert(1, 0, Obj("a", 10, 2)).ok());
  EXPECT_EQ(index.Find("a")->local_index, 1u);
  EXPECT_TRUE(index.Forget(0, 100));
  EXPECT_EQ(index.Find("a")->object.generation, 2u);
  // Overwritten by another object: gone.
  ASSERT_TRUE(index.Insert(1, 5, Obj("b", 10, 3)).ok());
  EXPECT_FALSE(index.Find("a").has_value());
  EXPECT_EQ(index.Find("b")->offset, 5u);
  // Erased with its generation only.
  EXPECT_FALSE(index.Erase(1, 5, 4));
  EXPECT_TRUE(index.Find("b").has_value());
  EXPECT_TRUE(index.Erase(1, 5, 3));
  EXPECT_FALSE(index.Find("b").has_value());
  EXPECT_EQ(index.size(), 0u);
}

TEST(ObjectIndex, RefusesUnknownSegmentsEmptyObjectsAndRangesOutside) {
  ObjectIndex index({1000});
  EXPECT_EQ(ToCode(index.Insert(1, 0, Obj("x", 10))), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(index.Insert(0, 0, Obj("x", 0))), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(index.Insert(0, 995, Obj("x", 10))), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(index.Insert(0, UINT64_MAX - 2, Obj("x", 10))), Code::kInvalidArgument);
  EXPECT_TRUE(index.Insert(0, 990, Obj("x", 10)).ok());
  EXPECT_EQ(index.size(), 1u);
}

TEST(ObjectIndex, ForgetDropsByOffsetAndEraseOnlyTheSameGeneration) {
  ObjectIndex index({1000, 1000});
  ASSERT_TRUE(index.Insert(0, 0, Obj("a", 10, 5)).ok());
  ASSERT_TRUE(index.Insert(1, 0, Obj("b", 10, 6)).ok());
  EXPECT_FALSE(index.Forget(0, 1));
  EXPECT_FALSE(index.Forget(7, 0));
  EXPECT_TRUE(index.Forget(0, 0));
  EXPECT_FALSE(index.Forget(0, 0));
  EXPECT_FALSE(index.Erase(1, 0, 5)) << "a newer object at that offset stays";
  EXPECT_TRUE(index.Erase(1, 0, 6));
  EXPECT_EQ(index.size(), 0u);
}

TEST(ObjectIndex, ConcurrentInsertsKeepTheCountExact) {
  ObjectIndex index({1 << 20});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&index, t] {
      for (uint64_t i = 0; i < 500; ++i) {
        ASSERT_TRUE(index.Insert(0, (i * 4 + t) * 64, Obj("k", 64, i)).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(index.size(), 2000u);
  EXPECT_EQ(index.Snapshot().size(), 2000u);
}

}  // namespace
}  // namespace mc::client
