// ShardLeases: leases kept beside a shard's objects, with a grant record per lease id that lets a
// release in grant order end leases without the objects. ShardLeases never reads an Object (it
// keys by address), so these tests use plain Objects and reuse addresses freely.
#include "master/shard_leases.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace mc::master {
namespace {

class ShardLeasesTest : public ::testing::Test {
 protected:
  static constexpr int kObjects = 12;
  ShardLeasesTest() : objects_(kObjects) {}
  const Object* O(int i) const { return &objects_[i]; }
  static std::string Key(int i) { return "key-" + std::to_string(i); }
  void Grant(int i, uint64_t id, int64_t expiry, uint64_t owner = 7) {
    leases_.Grant(O(i), Key(i), {id, expiry, owner}, 0);
  }
  std::optional<LeaseRelease> ByRecord(int i, uint64_t id, uint64_t owner = 7, int64_t now = 0) {
    return leases_.ReleaseGranted(id, Key(i), owner, now, &expired_);
  }
  // What a release of key i answers: from the record, or else from the object (as ReadService).
  LeaseRelease Released(int i, uint64_t id, uint64_t owner = 7, int64_t now = 0) {
    std::optional<LeaseRelease> answer = ByRecord(i, id, owner, now);
    return answer.has_value() ? *answer : leases_.Release(O(i), id, owner, now, &expired_);
  }

  std::vector<Object> objects_;
  ShardLeases leases_;
  size_t expired_ = 0;
};

TEST_F(ShardLeasesTest, ReleasesInGrantOrderEndEveryLeaseFromTheRecord) {
  for (int i = 0; i < kObjects; ++i) Grant(i, 1, 100);
  Grant(3, 2, 100);  // another batch's lease on one of them
  EXPECT_EQ(leases_.GrantCount(), 2u);
  for (int i = 0; i < kObjects; ++i) EXPECT_EQ(ByRecord(i, 1), LeaseRelease::kReleased) << i;
  EXPECT_EQ(leases_.objects().size(), 1u) << "only the other batch's lease is left";
  EXPECT_EQ(leases_.GrantCount(), 1u);
  EXPECT_EQ(ByRecord(3, 2), LeaseRelease::kReleased);
  EXPECT_TRUE(leases_.objects().empty());
  EXPECT_EQ(leases_.GrantCount(), 0u);
  EXPECT_EQ(leases_.SpareGrantCountForTest(), 2u) << "records kept for the next lookups";
  EXPECT_EQ(expired_, 0u);
  // Released twice: the record is gone, so the probe answers (nothing held).
  EXPECT_EQ(ByRecord(0, 1), std::nullopt);
  EXPECT_EQ(leases_.Release(O(0), 1, 7, 0, &expired_), LeaseRelease::kNotHeld);
}

TEST_F(ShardLeasesTest, KeysOutOfOrderOrNotGrantedAreLeftToTheProbe) {
  for (int i = 0; i < 4; ++i) Grant(i, 1, 100);
  EXPECT_EQ(ByRecord(1, 1), std::nullopt) << "the record expects key 0 first";
  EXPECT_EQ(ByRecord(5, 1), std::nullopt) << "never granted";
  EXPECT_EQ(ByRecord(0, 9), std::nullopt) << "no record for that lease id";
  EXPECT_EQ(leases_.Release(O(1), 1, 7, 0, &expired_), LeaseRelease::kReleased);
  EXPECT_EQ(ByRecord(0, 1), LeaseRelease::kReleased);
  EXPECT_EQ(ByRecord(1, 1), std::nullopt) << "ended already: only the object can tell";
  EXPECT_EQ(leases_.Release(O(1), 1, 7, 0, &expired_), LeaseRelease::kNotHeld);
  EXPECT_EQ(ByRecord(2, 1), LeaseRelease::kReleased);
  EXPECT_EQ(ByRecord(3, 1), LeaseRelease::kReleased);
  EXPECT_TRUE(leases_.objects().empty());
  EXPECT_EQ(leases_.GrantCount(), 0u);
}

TEST_F(ShardLeasesTest, AnotherOwnersReleaseChangesNothing) {
  Grant(0, 1, 100, /*owner=*/7);
  Grant(1, 1, 100, /*owner=*/7);
  EXPECT_EQ(ByRecord(0, 1, /*owner=*/8), LeaseRelease::kNotOwner);
  EXPECT_EQ(leases_.Release(O(1), 1, 8, 0, &expired_), LeaseRelease::kNotOwner);
  EXPECT_TRUE(leases_.HasLive(O(0), 0));
  EXPECT_TRUE(leases_.HasLive(O(1), 0));
  // The owner's own release still matches the record from its start.
  EXPECT_EQ(ByRecord(0, 1), LeaseRelease::kReleased);
  EXPECT_EQ(ByRecord(1, 1), LeaseRelease::kReleased);
  EXPECT_EQ(leases_.GrantCount(), 0u);
}

TEST_F(ShardLeasesTest, AnExpiredLeaseIsPrunedAndCountedNotReleased) {
  Grant(0, 1, 100);
  Grant(1, 1, 100);
  Grant(1, 2, 50);  // expires first
  EXPECT_EQ(ByRecord(0, 1, 7, /*now=*/100), LeaseRelease::kNotHeld);
  EXPECT_EQ(expired_, 1u);
  EXPECT_EQ(ByRecord(1, 1, 7, /*now=*/60), LeaseRelease::kReleased) << "lease 2 went first";
  EXPECT_EQ(expired_, 2u);
  EXPECT_TRUE(leases_.objects().empty());
  EXPECT_EQ(leases_.GrantCount(), 0u);
}

// An object erased while leased (its client went away) leaves no entry that names it: a later
// object at the same address, leased by another batch, is not released by the first batch's
// record.
TEST_F(ShardLeasesTest, AnErasedObjectsEntriesNameNothing) {
  Grant(0, 1, 100);
  Grant(1, 1, 100);
  leases_.Forget(O(0));
  EXPECT_EQ(leases_.GrantCount(), 1u);
  Grant(0, 2, 100);  // "a new object" at the same address, same key
  EXPECT_EQ(ByRecord(0, 1), std::nullopt) << "the entry of the erased object names nothing";
  EXPECT_EQ(Released(0, 1), LeaseRelease::kNotHeld);
  EXPECT_TRUE(leases_.HasLive(O(0), 0)) << "batch 2's lease is untouched";
  EXPECT_EQ(ByRecord(1, 1), LeaseRelease::kReleased);
  EXPECT_EQ(ByRecord(0, 2), LeaseRelease::kReleased);
  EXPECT_TRUE(leases_.objects().empty());
  EXPECT_EQ(leases_.GrantCount(), 0u);
}

TEST_F(ShardLeasesTest, AKeyGrantedTwiceInOneBatchHoldsTwoLeases) {
  Grant(0, 1, 100);
  Grant(0, 1, 100);
  EXPECT_EQ(leases_.Of(O(0)).size(), 2u);
  EXPECT_EQ(ByRecord(0, 1), LeaseRelease::kReleased);
  EXPECT_TRUE(leases_.HasLive(O(0), 0));
  EXPECT_EQ(ByRecord(0, 1), LeaseRelease::kReleased);
  EXPECT_EQ(ByRecord(0, 1), std::nullopt);
  EXPECT_EQ(leases_.Release(O(0), 1, 7, 0, &expired_), LeaseRelease::kNotHeld);
  EXPECT_EQ(leases_.GrantCount(), 0u);
  // Named twice but the probe ended one first (it ends the first it finds): the record's entry
  // is empty, yet the other lease is still held, and the release still ends it.
  Grant(1, 2, 100);
  Grant(1, 2, 100);
  EXPECT_EQ(leases_.Release(O(1), 2, 7, 0, &expired_), LeaseRelease::kReleased);
  EXPECT_EQ(Released(1, 2), LeaseRelease::kReleased);
  EXPECT_EQ(Released(1, 2), LeaseRelease::kNotHeld);
  EXPECT_TRUE(leases_.objects().empty());
}

TEST_F(ShardLeasesTest, SpareRecordsAreBoundedInNumberAndSize) {
  const size_t many = ShardLeases::kSpareGrants + 5;
  for (uint64_t id = 1; id <= many; ++id) Grant(static_cast<int>(id % kObjects), id, 100);
  leases_.Sweep(100, [](const Object*) {});
  EXPECT_EQ(leases_.GrantCount(), 0u);
  EXPECT_EQ(leases_.SpareGrantCountForTest(), ShardLeases::kSpareGrants);
  // A record that grew past the size kept is freed, not kept.
  ShardLeases big;
  const std::string long_key(ShardLeases::kSpareGrantKeyBytes, 'x');
  big.Grant(O(0), long_key, {1, 100, 7}, 0);
  big.Grant(O(1), long_key, {1, 100, 7}, 0);
  big.Sweep(100, [](const Object*) {});
  EXPECT_EQ(big.SpareGrantCountForTest(), 0u);
  // So is one with more entries than kept, however short its keys.
  for (size_t i = 0; i <= ShardLeases::kSpareGrantEntries; ++i)
    big.Grant(O(0), "k", {2, 100, 7}, 0);
  EXPECT_EQ(big.GrantCount(), 1u);
  big.Sweep(100, [](const Object*) {});
  EXPECT_EQ(big.GrantCount(), 0u);
  EXPECT_EQ(big.SpareGrantCountForTest(), 0u);
  big.Grant(O(0), "k", {3, 100, 7}, 0);
  big.Sweep(100, [](const Object*) {});
  EXPECT_EQ(big.SpareGrantCountForTest(), 1u) << "a small record is kept";
}

// Random grants, releases (in grant order, shuffled, by other owners, twice), erasures and sweeps
// against a plain list of leases: every answer and every expired count is what the plain list
// gives, and everything comes back to zero.
TEST_F(ShardLeasesTest, AgreesWithAPlainListOfLeases) {
  struct Held {
    int object;
    uint64_t id;
    uint64_t owner;
    int64_t expiry;
  };
  std::vector<Held> model;
  size_t model_expired = 0;
  auto model_prune = [&](int object, int64_t now) {
    auto dead = [&](const Held& h) { return h.object == object && h.expiry <= now; };
    model_expired += static_cast<size_t>(std::count_if(model.begin(), model.end(), dead));
    model.erase(std::remove_if(model.begin(), model.end(), dead), model.end());
  };
  auto model_release = [&](int object, uint64_t id, uint64_t owner, int64_t now) {
    model_prune(object, now);
    for (auto it = model.begin(); it != model.end(); ++it) {
      if (it->object != object || it->id != id) continue;
      if (it->owner != owner) return LeaseRelease::kNotOwner;
      model.erase(it);
      return LeaseRelease::kReleased;
    }
    return LeaseRelease::kNotHeld;
  };
  std::mt19937 rng(7);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  std::vector<std::vector<int>> batches;  // keys granted per lease id (id = index + 1)
  int64_t now = 0;
  for (int step = 0; step < 4000; ++step) {
    const int op = pick(10);
    if (op < 3) {  // a batch: some objects, some twice, one owner, one expiry
      const uint64_t id = batches.size() + 1;
      const uint64_t owner = 1 + static_cast<uint64_t>(pick(2));
      const int64_t expiry = now + 1 + pick(40);
      std::vector<int> keys;
      for (int n = 1 + pick(6); n > 0; --n) keys.push_back(pick(kObjects));
      for (int k : keys) {
        model_prune(k, now);
        model.push_back({k, id, owner, expiry});
        expired_ += leases_.Grant(O(k), Key(k), {id, expiry, owner}, now);
      }
      batches.push_back(keys);
    } else if (op < 8 && !batches.empty()) {  // a release of a batch's keys
      const uint64_t id = 1 + static_cast<uint64_t>(pick(static_cast<int>(batches.size())));
      std::vector<int> keys = batches[id - 1];
      if (pick(3) == 0) std::shuffle(keys.begin(), keys.end(), rng);
      if (pick(3) == 0) keys.resize(static_cast<size_t>(pick(static_cast<int>(keys.size()) + 1)));
      const uint64_t owner = 1 + static_cast<uint64_t>(pick(2));
      for (int k : keys) {
        const LeaseRelease want = model_release(k, id, owner, now);
        ASSERT_EQ(Released(k, id, owner, now), want)
            << "step " << step << " key " << k << " id " << id;
        ASSERT_EQ(expired_, model_expired) << "step " << step;
      }
    } else if (op == 8) {  // an object erased
      const int k = pick(kObjects);
      model.erase(
          std::remove_if(model.begin(), model.end(), [&](const Held& h) { return h.object == k; }),
          model.end());
      leases_.Forget(O(k));
    } else {  // time passes; sometimes the sweep runs
      now += pick(5);
      if (pick(4) == 0) {
        const size_t before = model.size();
        model.erase(std::remove_if(model.begin(), model.end(),
                                   [&](const Held& h) { return h.expiry <= now; }),
                    model.end());
        model_expired += before - model.size();
        expired_ += leases_.Sweep(now, [](const Object*) {});
        ASSERT_EQ(expired_, model_expired) << "step " << step;
      }
    }
    for (int k = 0; k < kObjects; ++k) {
      const size_t want = static_cast<size_t>(
          std::count_if(model.begin(), model.end(), [&](const Held& h) { return h.object == k; }));
      ASSERT_EQ(leases_.Of(O(k)).size(), want) << "step " << step << " object " << k;
    }
  }
  now += 100;
  expired_ += leases_.Sweep(now, [](const Object*) {});
  EXPECT_TRUE(leases_.objects().empty());
  EXPECT_EQ(leases_.GrantCount(), 0u) << "every record ended with its last lease";
  EXPECT_LE(leases_.SpareGrantCountForTest(), ShardLeases::kSpareGrants);
}

}  // namespace
}  // namespace mc::master
