// ObjectTable::ForKeys: every position visited exactly once, grouped by shard (each shard locked
// once), ascending within a shard, for empty, single-key and large batches.
#include "master/object_table.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace mc::master
