// ObjectTable::ForKeys: every position visited exactly once, grouped by shard (each shard locked
// once), ascending within a shard, for empty, single-key and large batches. The layout of a
// stored object (master memory per object: millions of objects): sizes, the key stored once in the
// node, the intrusive LRU list.
#include "master/object_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"
#include "common/status.h"

namespace mc::master {
namespace {

void CheckVisits(ObjectTable& table, const std::vector<std::string>& keys) {
  std::vector<std::string_view> views(keys.begin(), keys.end());
  std::vector<int> seen(keys.size(), 0);
  std::set<const ObjectTable::Shard*> shards;
  table.ForKeys(views, [&](ObjectTable::Shard& shard, const std::vector<size_t>& indices) {
    EXPECT_TRUE(shards.insert(&shard).second) << "a shard was visited twice";
    ASSERT_FALSE(indices.empty());
    for (size_t k = 0; k < indices.size(); ++k) {
      if (k > 0) {
        EXPECT_LT(indices[k - 1], indices[k]);
      }
      ASSERT_LT(indices[k], keys.size());
      ++seen[indices[k]];
      EXPECT_EQ(&table.ShardOf(views[indices[k]]), &shard) << keys[indices[k]];
    }
  });
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(seen[i], 1) << keys[i];
}

TEST(ObjectTable, ForKeysVisitsEveryPositionOnceGroupedByShard) {
  ObjectTable table(8);
  CheckVisits(table, {});
  CheckVisits(table, {"only"});
  std::vector<std::string> many;
  for (int i = 0; i < 1000; ++i) many.push_back("key-" + std::to_string(i * 7919));
  CheckVisits(table, many);
  many.push_back("key-0");  // a repeated key is visited at both positions
  CheckVisits(table, many);
}

// A shard's map takes each key's control byte from the low 7 bits of the same hash the table
// shards by: a shard index taken from those bits would leave the keys of one shard few distinct
// control bytes, and every probe would compare the keys of many nodes (a cache miss each).
TEST(ObjectTable, ShardIndexLeavesTheMapsControlBytesSpread) {
  ObjectTable table(32);
  const ObjectTable::Shard& first = table.ShardOf("key-0");
  std::set<size_t> control_bytes;
  size_t in_shard = 0;
  for (int i = 0; i < 20000; ++i) {
    const std::string key = "key-" + std::to_string(i);
    if (&table.ShardOf(key) != &first) continue;
    ++in_shard;
    control_bytes.insert(absl::HashOf(absl::string_view(key)) & 0x7f);
  }
  ASSERT_GT(in_shard, 400u);
  EXPECT_GT(control_bytes.size(), 120u) << "of 128, over " << in_shard << " keys of one shard";
}

// FindEach finds a chunk of keys before it calls fn for them: fn still sees every position once,
// in order, with the object of its key (end() when absent), over several chunks, absent keys and a
// repeated key.
TEST(ObjectTable, FindEachAnswersEveryPositionInOrderAcrossChunks) {
  ObjectTable table(1);
  ObjectTable::Shard& shard = table.ShardOf("x");
  std::vector<std::string> keys;
  for (int i = 0; i < 100; ++i) keys.push_back("key-" + std::to_string(i));
  keys.push_back("key-3");
  absl::MutexLock lock(&shard.mu);
  for (size_t i = 0; i < keys.size(); i += 2) {
    if (!shard.objects.contains(keys[i])) shard.Insert(keys[i], Object{});
  }
  const std::vector<std::string_view> views(keys.begin(), keys.end());
  std::vector<size_t> indices;
  for (size_t i = 0; i < keys.size(); ++i) indices.push_back(i);
  indices.erase(indices.begin() + 7);  // a position not asked for
  std::vector<size_t> visited;
  shard.FindEach(views, indices, [&](size_t i, ObjectMap::iterator it) {
    shard.mu.AssertHeld();
    visited.push_back(i);
    if (shard.objects.contains(keys[i])) {
      ASSERT_NE(it, shard.objects.end()) << keys[i];
      EXPECT_EQ(it->first, keys[i]);
      EXPECT_EQ(it.object(), shard.objects.find(keys[i]).object());
    } else {
      EXPECT_EQ(it, shard.objects.end()) << keys[i];
    }
  });
  EXPECT_EQ(visited, indices);
}

// The per-object budget (<= 200 bytes beyond the key at 10 M objects, measured by
// bench/recovery_bench.cc): a node is an Object plus the key's bytes; the table slot adds ~15
// bytes and the segment allocator's B-tree entry ~20. Growing these types breaks the budget.
static_assert(sizeof(StoredReplica) == 40, "compact replica: 4 numbers, a peer index, the tier");
static_assert(sizeof(Object::Replicas) == 48, "one replica inline");
static_assert(sizeof(Object) <= 120, "the hot part of an object; rare state goes in Transient");
static_assert(ObjectMap::NodeBytes(64) <= 184);

std::vector<std::string> LruOrder(ObjectTable::Shard& shard) {
  absl::MutexLock lock(&shard.mu);
  std::vector<std::string> oldest_first;
  for (const Object* o = shard.LruOldest(); o != nullptr; o = o->lru_newer()) {
    oldest_first.emplace_back(o->key());
  }
  std::vector<std::string> newest_first;
  for (const Object* o = shard.LruNewest(); o != nullptr; o = o->lru_older()) {
    newest_first.emplace_back(o->key());
  }
  EXPECT_EQ(std::vector<std::string>(newest_first.rbegin(), newest_first.rend()), oldest_first)
      << "the list's links disagree";
  return oldest_first;
}

TEST(ObjectTable, NodesKeepTheirKeyAndFieldsAndAreFoundByAnyStringType) {
  ObjectTable table(1);
  ObjectTable::Shard& shard = table.ShardOf("x");
  const std::string long_key(4096, 'k');
  {
    absl::MutexLock lock(&shard.mu);
    Object fields;
    fields.size = 7;
    fields.generation = 3;
    fields.replicas.push_back(StoredReplica::Of(
        ReplicaTier::kMemory, MemoryLocation{"client", "10.0.0.1:1", 9, 64, 7, 3}));
    EXPECT_EQ(fields.key(), "") << "an object outside the table has no key";
    const Object& stored = shard.Insert("short", std::move(fields));
    EXPECT_EQ(stored.key(), "short");
    shard.Insert(long_key, Object{});
    shard.Insert("", Object{});
    ASSERT_EQ(shard.objects.size(), 3u);
    const Object* found = shard.objects.find(std::string_view("short")).object();
    ASSERT_EQ(found, &stored);
    EXPECT_EQ(found->size, 7u);
    MemoryLocation loc = found->replicas[0].location();
    EXPECT_EQ(loc.client_id, "client");
    EXPECT_EQ(loc.endpoint, "10.0.0.1:1");
    EXPECT_EQ(loc.segment_id, 9u);
    EXPECT_EQ(loc.offset, 64u);
    EXPECT_EQ(loc.length, 7u);
    EXPECT_EQ(loc.generation, 3u);
    EXPECT_EQ(found->replicas[0].client_id(), "client");
    EXPECT_EQ(shard.objects.find(long_key)->first, long_key);
    EXPECT_TRUE(shard.objects.contains(absl::string_view("")));
    EXPECT_FALSE(shard.objects.contains(std::string("absent")));
    EXPECT_EQ(shard.objects.find(std::string_view("absent")), shard.objects.end());
    shard.Erase(shard.objects.find(long_key));
    EXPECT_FALSE(shard.objects.contains(long_key));
    EXPECT_EQ(shard.objects.size(), 2u);
  }  // the rest is freed with the table (ASan would report a leak)
}

TEST(ObjectTable, IntrusiveLruKeepsExactRecencyThroughTouchAndErase) {
  ObjectTable table(1);
  ObjectTable::Shard& shard = table.ShardOf("a");
  EXPECT_TRUE(LruOrder(shard).empty());
  {
    absl::MutexLock lock(&shard.mu);
    for (const char* key : {"a", "b", "c", "d"}) shard.Insert(key, Object{});
  }
  EXPECT_EQ(LruOrder(shard), (std::vector<std::string>{"a", "b", "c", "d"}));
  uint64_t seq_before = 0;
  {
    absl::MutexLock lock(&shard.mu);
    seq_before = shard.LruNewest()->access_seq;
    const Object& a = shard.objects.find(std::string_view("a"))->second;
    shard.Touch(a);  // oldest to newest
    EXPECT_GT(a.access_seq, seq_before);
    shard.Touch(a);                                                  // already the newest
    shard.Touch(shard.objects.find(std::string_view("c"))->second);  // from the middle
  }
  EXPECT_EQ(LruOrder(shard), (std::vector<std::string>{"b", "d", "a", "c"}));
  {
    absl::MutexLock lock(&shard.mu);
    shard.Erase(shard.objects.find(std::string_view("b")));  // the oldest
    shard.Erase(shard.objects.find(std::string_view("c")));  // the newest
  }
  EXPECT_EQ(LruOrder(shard), (std::vector<std::string>{"d", "a"}));
  {
    absl::MutexLock lock(&shard.mu);
    shard.Erase(shard.objects.find(std::string_view("d")));
    shard.Erase(shard.objects.find(std::string_view("a")));
    EXPECT_EQ(shard.LruOldest(), nullptr);
    EXPECT_EQ(shard.LruNewest(), nullptr);
    shard.Insert("e", Object{});
  }
  EXPECT_EQ(LruOrder(shard), (std::vector<std::string>{"e"}));
}

// Reads mark, they do not move: the list keeps placement order until SecondChance moves a read
// object to the front and clears its mark; unread objects keep their order.
TEST(ObjectTable, ReadsGetASecondChanceInsteadOfARelink) {
  ObjectTable table(1);
  ObjectTable::Shard& shard = table.ShardOf("a");
  absl::MutexLock lock(&shard.mu);
  for (const char* key : {"a", "b", "c", "d", "e"}) shard.Insert(key, Object{});
  auto find = [&](const char* key) -> const Object& {
    shard.mu.AssertHeld();
    return shard.objects.find(std::string_view(key))->second;
  };
  const uint64_t seq_before = find("e").access_seq;
  shard.MarkRead(find("b"));
  shard.MarkRead(find("a"));
  shard.MarkRead(find("e"));  // the newest: nothing to mark
  EXPECT_GT(find("b").access_seq, seq_before);
  EXPECT_GT(find("a").access_seq, find("b").access_seq);
  EXPECT_TRUE(find("a").lru_read);
  EXPECT_FALSE(find("e").lru_read);
  std::vector<std::string> order;
  auto lru_order = [&]() {
    shard.mu.AssertHeld();
    order.clear();
    for (const Object* o = shard.LruOldest(); o != nullptr; o = o->lru_newer()) {
      order.emplace_back(o->key());
    }
    return order;
  };
  EXPECT_EQ(lru_order(), (std::vector<std::string>{"a", "b", "c", "d", "e"})) << "no relink";
  // A walk from the cold end, as eviction's: marked objects go to the front as it meets them.
  std::vector<std::string> unread;
  const Object* next = nullptr;
  for (const Object* o = shard.LruOldest(); o != nullptr && unread.size() < 3; o = next) {
    next = o->lru_newer();
    if (o->lru_read) {
      shard.SecondChance(*o);
    } else {
      unread.emplace_back(o->key());
    }
  }
  EXPECT_EQ(unread, (std::vector<std::string>{"c", "d", "e"}));
  EXPECT_EQ(lru_order(), (std::vector<std::string>{"c", "d", "e", "a", "b"}));
  EXPECT_FALSE(find("a").lru_read);
  EXPECT_FALSE(find("b").lru_read);
  // Touch (a put's end) still moves at once, and clears a mark.
  shard.MarkRead(find("c"));
  shard.Touch(find("c"));
  EXPECT_FALSE(find("c").lru_read);
  EXPECT_EQ(lru_order(), (std::vector<std::string>{"d", "e", "a", "b", "c"}));
  // Erasing a marked object unlinks it like any other; the newest needs no move.
  shard.MarkRead(find("e"));
  shard.Erase(&find("e"));
  EXPECT_EQ(lru_order(), (std::vector<std::string>{"d", "a", "b", "c"}));
  shard.MarkRead(find("d"));
  shard.SecondChance(find("d"));
  shard.SecondChance(find("d"));  // already the newest, unmarked: nothing moves
  EXPECT_EQ(lru_order(), (std::vector<std::string>{"a", "b", "c", "d"}));
}

TEST(ObjectTable, LeasedIndexForgetsErasedObjects) {
  ObjectTable table(1);
  ObjectTable::Shard& shard = table.ShardOf("k");
  absl::MutexLock lock(&shard.mu);
  const Object& o = shard.Insert("k", Object{});
  EXPECT_EQ(shard.GrantLease(o, {1, 100, 0}, 0), 0u);
  EXPECT_EQ(shard.GrantLease(o, {2, 100, 0}, 0), 0u);
  EXPECT_EQ(shard.leased().size(), 1u) << "indexed once";
  EXPECT_FALSE(o.has_transient()) << "leases live in the shard, not in the object";
  shard.Erase(&o);
  EXPECT_TRUE(shard.leased().empty());
  EXPECT_EQ(shard.LeaseGrantCount(), 0u) << "the grant records ended too";
}

// The leased index holds exactly the objects with a lease (or an expired one the sweep has not
// seen yet): a release that ends an object's last lease takes it out at once; a release that
// leaves another reader's lease keeps it in.
TEST(ObjectTable, ReleasingTheLastLeaseLeavesTheIndexAtOnce) {
  ObjectTable table(1);
  ObjectTable::Shard& shard = table.ShardOf("a");
  absl::MutexLock lock(&shard.mu);
  const Object& a = shard.Insert("a", Object{});
  const Object& b = shard.Insert("b", Object{});
  shard.GrantLease(a, {1, 100, 7}, 0);
  shard.GrantLease(a, {2, 100, 8}, 0);
  shard.GrantLease(b, {1, 100, 7}, 0);
  EXPECT_EQ(shard.leased().size(), 2u);
  size_t expired = 0;
  EXPECT_EQ(shard.ReleaseLease(a, 1, 7, 10, &expired), LeaseRelease::kReleased);
  EXPECT_EQ(shard.leased().size(), 2u) << "a is still leased by 8";
  EXPECT_TRUE(shard.HasLiveLease(a, 10));
  EXPECT_EQ(shard.ReleaseLease(a, 2, 9, 10, &expired), LeaseRelease::kNotOwner);
  EXPECT_EQ(shard.leased().size(), 2u) << "a refused release changes nothing";
  EXPECT_EQ(shard.ReleaseLease(a, 2, 8, 10, &expired), LeaseRelease::kReleased);
  EXPECT_EQ(shard.leased().count(&a), 0u);
  EXPECT_FALSE(a.maybe_leased) << "found by key: the node's mark is cleared with it";
  // Releasing an expired lease: pruned (counted as expired), and the object leaves the index.
  EXPECT_EQ(shard.ReleaseLease(b, 1, 7, 100, &expired), LeaseRelease::kNotHeld);
  EXPECT_EQ(expired, 1u);
  EXPECT_TRUE(shard.leased().empty());
  EXPECT_EQ(shard.LeaseGrantCount(), 0u);
  // A transient record (an offload mark) is not touched by leases.
  shard.MarkOffloadQueued(b, 5);
  shard.GrantLease(b, {3, 200, 7}, 100);
  EXPECT_EQ(shard.ReleaseLease(b, 3, 7, 100, &expired), LeaseRelease::kReleased);
  EXPECT_TRUE(shard.leased().empty());
  ASSERT_TRUE(b.has_transient());
  EXPECT_EQ(b.offload_queued_ms(), 5);
  // Leased again after the release: indexed again, and the sweep still expires it.
  shard.GrantLease(a, {4, 300, 7}, 100);
  EXPECT_EQ(shard.leased().size(), 1u);
  EXPECT_EQ(shard.SweepLeases(300), 1u);
  EXPECT_TRUE(shard.leased().empty());
  EXPECT_FALSE(a.maybe_leased);
  EXPECT_EQ(shard.LeaseGrantCount(), 0u);
}

// Many objects leased by several batches and released in a shuffled order: at every step the
// index holds exactly the objects that still have a lease, and the counts return to zero.
TEST(ObjectTable, LeasedIndexTracksLeasesThroughShuffledReleases) {
  ObjectTable table(1);
  ObjectTable::Shard& shard = table.ShardOf("k0");
  absl::MutexLock lock(&shard.mu);
  constexpr int kObjects = 200;
  constexpr uint64_t kBatches = 3;
  std::vector<const Object*> objects;
  for (int i = 0; i < kObjects; ++i) objects.push_back(&shard.Insert("k" + std::to_string(i), {}));
  std::vector<std::pair<uint64_t, int>> grants;  // (lease id, object)
  for (uint64_t id = 1; id <= kBatches; ++id) {
    for (int i = 0; i < kObjects; ++i) {
      if ((i + static_cast<int>(id)) % 3 == 0) continue;  // each batch skips a third
      shard.GrantLease(*objects[i], {id, 1000, 7}, 0);
      grants.push_back({id, i});
    }
  }
  std::vector<int> held(kObjects, 0);
  for (const auto& g : grants) ++held[g.second];
  std::mt19937 rng(42);
  std::shuffle(grants.begin(), grants.end(), rng);
  size_t expired = 0;
  for (const auto& [id, i] : grants) {
    ASSERT_EQ(shard.ReleaseLease(*objects[i], id, 7, 1, &expired), LeaseRelease::kReleased);
    --held[i];
    EXPECT_EQ(shard.LeasesOf(*objects[i]).size(), static_cast<size_t>(held[i]));
    EXPECT_EQ(shard.leased().count(objects[i]) == 1, held[i] > 0) << i;
  }
  EXPECT_EQ(expired, 0u);
  EXPECT_TRUE(shard.leased().empty());
  EXPECT_EQ(shard.LeaseGrantCount(), 0u);
  EXPECT_EQ(shard.SweepLeases(2000), 0u);
}

// Leases keep one inline; more readers of one key spill over, and pruning, releasing out of order
// and the owner check work the same on either side of that line.
TEST(ObjectTable, ManyLeasesOnOneObjectPruneAndReleaseInAnyOrder) {
  ObjectTable table(1);
  ObjectTable::Shard& shard = table.ShardOf("k");
  absl::MutexLock lock(&shard.mu);
  const Object& o = shard.Insert("k", Object{});
  for (uint64_t id = 1; id <= 5; ++id) {
    EXPECT_EQ(shard.GrantLease(o, {id, static_cast<int64_t>(id) * 100, /*owner=*/7}, 0), 0u);
  }
  ASSERT_EQ(shard.LeasesOf(o).size(), 5u);
  size_t expired = 0;
  EXPECT_EQ(shard.ReleaseLease(o, 4, /*owner=*/8, 0, &expired), LeaseRelease::kNotOwner);
  EXPECT_EQ(shard.ReleaseLease(o, 4, 7, 0, &expired), LeaseRelease::kReleased);
  EXPECT_EQ(shard.ReleaseLease(o, 4, 7, 0, &expired), LeaseRelease::kNotHeld);
  EXPECT_EQ(expired, 0u);
  // At 250 ms leases 1 and 2 have expired; 3 and 5 remain, in order.
  EXPECT_EQ(shard.ReleaseLease(o, 1, 7, 250, &expired), LeaseRelease::kNotHeld);
  EXPECT_EQ(expired, 2u);
  ASSERT_EQ(shard.LeasesOf(o).size(), 2u);
  EXPECT_EQ(shard.LeasesOf(o)[0].id, 3u);
  EXPECT_EQ(shard.LeasesOf(o)[1].id, 5u);
  EXPECT_TRUE(shard.HasLiveLease(o, 250));
  EXPECT_EQ(shard.SweepLeases(600), 2u);
  EXPECT_TRUE(shard.leased().empty());
  EXPECT_FALSE(o.maybe_leased) << "the sweep clears the mark of an object with no lease left";
  EXPECT_EQ(shard.LeaseGrantCount(), 0u);
}

TEST(Object, TransientStateIsAllocatedOnDemandAndTrimmedWhenEmpty) {
  ObjectTable table(1);
  ObjectTable::Shard& shard = table.ShardOf("k");
  absl::MutexLock lock(&shard.mu);
  const Object& o = shard.Insert("k", Object{});
  EXPECT_FALSE(o.has_transient());
  EXPECT_EQ(o.promotion(), nullptr);
  EXPECT_TRUE(shard.LeasesOf(o).empty());
  size_t expired = 0;
  EXPECT_EQ(shard.ReleaseLease(o, 1, 0, 0, &expired), LeaseRelease::kNotHeld);
  EXPECT_EQ(shard.SweepLeases(0), 0u);
  shard.EndPromotion(o);
  shard.ClearOffloadMarks(o);
  EXPECT_FALSE(o.has_transient()) << "nothing to record allocates nothing";
  shard.StartPromotion(o, Object::Promotion{{}, "writer", 5});
  ASSERT_NE(o.promotion(), nullptr);
  EXPECT_EQ(o.promotion()->writer, "writer");
  shard.GrantLease(o, {1, 100, 0}, 0);
  shard.EndPromotion(o);
  EXPECT_FALSE(o.has_transient()) << "a lease needs none";
  EXPECT_EQ(shard.ReleaseLease(o, 1, 7, 50, &expired), LeaseRelease::kNotOwner);
  EXPECT_EQ(shard.ReleaseLease(o, 1, 0, 50, &expired), LeaseRelease::kReleased);
  EXPECT_EQ(expired, 0u);
  EXPECT_EQ(shard.SweepLeases(50), 0u);
  EXPECT_TRUE(shard.leased().empty());
  shard.MarkOffloadFailed(o, 9);
  EXPECT_EQ(o.offload_failed_ms(), 9);
  shard.ClearOffloadMarks(o);
  EXPECT_FALSE(o.has_transient());
}

// The one-writer contract (no path changes an object behind its shard's lock): the table is
// the only writer of object state. What its iterators
// and LRU walks hand out is const, and Object's mutators are not reachable from outside it.
// (Each line fails to compile, or the assertion fails, if a write path is opened again.)
template <typename T>
concept CanTrimTransient = requires(T& t) {
  t.TrimTransient();
};
template <typename T>
concept CanWriteSize = requires(T&& entry) {
  entry.second.size = 1;
};
static_assert(!CanTrimTransient<Object>, "Object's mutators are the table's alone");
static_assert(!CanWriteSize<ObjectMap::Entry>, "iterators hand out const objects");
static_assert(
    std::is_same_v<decltype(std::declval<ObjectMap::iterator>().object()), const Object*>);
static_assert(
    std::is_same_v<decltype(std::declval<ObjectTable::Shard&>().LruOldest()), const Object*>);
static_assert(std::is_same_v<decltype(std::declval<const Object&>().lru_newer()), const Object*>);

TEST(ObjectTable, ReplicasKeepMemoryBeforeDisk) {
  ObjectTable table(1);
  ObjectTable::Shard& shard = table.ShardOf("k");
  absl::MutexLock lock(&shard.mu);
  const Object& o = shard.Insert("k", Object{});
  auto replica = [](ReplicaTier tier, uint64_t segment) {
    return StoredReplica::Of(tier, MemoryLocation{"c", "10.0.0.1:1", segment, 0, 8, 1});
  };
  shard.AddReplica(o, replica(ReplicaTier::kDisk, 1));
  shard.AddReplica(o, replica(ReplicaTier::kMemory, 2));
  shard.AddReplica(o, replica(ReplicaTier::kDisk, 3));
  shard.AddReplica(o, replica(ReplicaTier::kMemory, 4));
  std::vector<uint64_t> order;
  for (const StoredReplica& r : o.replicas) order.push_back(r.segment_id);
  EXPECT_EQ(order, (std::vector<uint64_t>{2, 4, 1, 3}));
  EXPECT_EQ(shard.RemoveReplicas(o, [](const StoredReplica& r) { return r.segment_id % 2 == 0; }),
            2u);
  EXPECT_FALSE(o.HasMemoryReplica());
  EXPECT_EQ(o.replicas.size(), 2u);
}

TEST(ObjectTable, CompletePutEndsThePutAndTouches) {
  ObjectTable table(1);
  ObjectTable::Shard& shard = table.ShardOf("a");
  absl::MutexLock lock(&shard.mu);
  Object fields;
  fields.size = 5;
  fields.generation = 11;
  const Object& a = shard.Insert("a", std::move(fields));
  shard.BeginPut(a, 100, 2);
  shard.Insert("b", Object{});
  EXPECT_EQ(a.put_start_ms(), 100);
  EXPECT_EQ(a.replicas_asked(), 2u);
  EXPECT_EQ(a.state, ObjectState::kPending);
  EXPECT_NE(shard.LruNewest(), &a);
  shard.CompletePut(a, 0xfeed);
  EXPECT_EQ(a.state, ObjectState::kComplete);
  EXPECT_EQ(a.checksum, 0xfeedu);
  EXPECT_EQ(a.generation, 11u);
  EXPECT_EQ(shard.LruNewest(), &a);
  EXPECT_FALSE(a.has_transient()) << "the put's marks go with it";
}

TEST(ObjectTable, PromotionBecomesAMemoryReplicaBeforeDiskOnes) {
  ObjectTable table(1);
  ObjectTable::Shard& shard = table.ShardOf("k");
  absl::MutexLock lock(&shard.mu);
  const Object& o = shard.Insert("k", Object{});
  shard.AddReplica(
      o, StoredReplica::Of(ReplicaTier::kDisk, MemoryLocation{"c", "10.0.0.1:1", 0, 4096, 8, 1}));
  shard.StartPromotion(o, Object::Promotion{{}, "c", 5});
  shard.PlacePromotion(o, MemoryLocation{"c", "10.0.0.1:1", 7, 64, 8, 1});
  shard.CompletePromotion(o);
  EXPECT_EQ(o.promotion(), nullptr);
  ASSERT_EQ(o.replicas.size(), 2u);
  EXPECT_EQ(o.replicas[0].tier, ReplicaTier::kMemory);
  EXPECT_EQ(o.replicas[0].segment_id, 7u);
  EXPECT_EQ(o.replicas[1].tier, ReplicaTier::kDisk);
  EXPECT_FALSE(o.has_transient());
}

TEST(ObjectTable, OffloadMarksExpireEachOnItsOwn) {
  ObjectTable table(1);
  ObjectTable::Shard& shard = table.ShardOf("k");
  absl::MutexLock lock(&shard.mu);
  const Object& o = shard.Insert("k", Object{});
  shard.MarkOffloadQueued(o, 100);
  EXPECT_EQ(o.offload_queued_ms(), 100);
  shard.MarkOffloadFailed(o, 150);
  EXPECT_EQ(o.offload_queued_ms(), 0) << "a failure ends the queued task";
  shard.MarkOffloadQueued(o, 120);
  shard.ExpireOffloadMarks(o, 219, 100);
  EXPECT_EQ(o.offload_queued_ms(), 120);
  shard.ExpireOffloadMarks(o, 220, 100);
  EXPECT_EQ(o.offload_queued_ms(), 0);
  EXPECT_EQ(o.offload_failed_ms(), 150);
  shard.ExpireOffloadMarks(o, 250, 100);
  EXPECT_EQ(o.offload_failed_ms(), 0);
  EXPECT_FALSE(o.has_transient());
}

TEST(PeerNames, InternsEachPairOnceAndKeepsIndicesStable) {
  PeerNames& names = PeerNames::Instance();
  EXPECT_EQ(names.Intern("", ""), 0u);
  const uint32_t a = names.Intern("peer-names-test", "10.0.0.1:1");
  const uint32_t b = names.Intern("peer-names-test", "10.0.0.1:2");
  EXPECT_NE(a, b);
  EXPECT_EQ(names.Intern("peer-names-test", "10.0.0.1:1"), a);
  const PeerNames::Peer& p = names.Get(a);
  for (int i = 0; i < 600; ++i) names.Intern("peer-names-test-" + std::to_string(i), "e");
  EXPECT_EQ(&names.Get(a), &p) << "entries never move";
  EXPECT_EQ(p.client_id, "peer-names-test");
  EXPECT_EQ(names.Get(b).endpoint, "10.0.0.1:2");
}

TEST(PeerNames, AFullTableRefusesNewPairsAndStillFindsKnownOnes) {
  PeerNames& names = PeerNames::Instance();
  const uint32_t known = names.Intern("peer-names-full", "10.0.0.9:1");
  names.SetCapacityForTest(static_cast<uint32_t>(names.SizeForTest()) + 1);
  EXPECT_TRUE(names.TryIntern("peer-names-full", "10.0.0.9:2").ok()) << "the last free slot";
  absl::StatusOr<uint32_t> refused = names.TryIntern("peer-names-full", "10.0.0.9:3");
  EXPECT_EQ(ToCode(refused.status()), Code::kNoSpace);
  EXPECT_NE(refused.status().message().find("restart or fail over the master"),
            std::string_view::npos);
  absl::StatusOr<uint32_t> again = names.TryIntern("peer-names-full", "10.0.0.9:1");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, known);
  names.SetCapacityForTest(UINT32_MAX);
  EXPECT_TRUE(names.TryIntern("peer-names-full", "10.0.0.9:3").ok());
}

}  // namespace
}  // namespace mc::master
