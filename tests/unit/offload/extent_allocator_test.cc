#include "offload/extent_allocator.h"

#include <random>
#include <vector>

#include "common/status.h"
#include "gtest/gtest.h"

namespace mc::offload {
namespace {

// Reference model: one bool per page per file (true = used).
struct Model {
  std::vector<std::vector<bool>> used;
  // Maximal free runs as (length, file, offset) in pages.
  std::vector<std::tuple<uint64_t, uint32_t, uint64_t>> Runs() const {
    std::vector<std::tuple<uint64_t, uint32_t, uint64_t>> runs;
    for (uint32_t f = 0; f < used.size(); ++f) {
      uint64_t start = 0;
      for (uint64_t p = 0; p <= used[f].size(); ++p) {
        if (p == used[f].size() || used[f][p]) {
          if (p > start) runs.emplace_back(p - start, f, start);
          start = p + 1;
        }
      }
    }
    return runs;
  }
};

TEST(ExtentAllocator, MatchesReferenceModelOverRandomAllocFree) {
  const std::vector<uint64_t> pages = {64, 40, 100};
  std::vector<uint64_t> sizes;
  Model model;
  for (uint64_t p : pages) {
    sizes.push_back(p * kPageSize + 123);  // a ragged tail is rounded down
    model.used.emplace_back(p, false);
  }
  ExtentAllocator alloc(sizes);
  EXPECT_EQ(alloc.capacity(), (64 + 40 + 100) * kPageSize);
  std::mt19937_64 rng(42);
  std::vector<Extent> live;
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 100 < 55) {
      const uint64_t bytes = 1 + rng() % (12 * kPageSize);
      const uint64_t want = (bytes + kPageSize - 1) / kPageSize;
      auto runs = model.Runs();
      std::optional<std::tuple<uint64_t, uint32_t, uint64_t>> best;
      for (auto& r : runs) {
        if (std::get<0>(r) >= want && (!best || r < *best)) best = r;
      }
      auto e = alloc.Allocate(bytes);
      ASSERT_EQ(e.has_value(), best.has_value()) << "step " << step;  // no spurious failure
      if (!e) continue;
      EXPECT_EQ(e->length, want * kPageSize);
      // Best fit: the extent starts the smallest fitting run (lowest file/offset on ties).
      EXPECT_EQ(e->file, std::get<1>(*best));
      EXPECT_EQ(e->offset, std::get<2>(*best) * kPageSize);
      for (uint64_t p = e->offset / kPageSize; p < e->offset / kPageSize + want; ++p) {
        ASSERT_LT(p, model.used[e->file].size());
        ASSERT_FALSE(model.used[e->file][p]) << "overlap at step " << step;
        model.used[e->file][p] = true;
      }
      live.push_back(*e);
    } else {
      const size_t i = rng() % live.size();
      Extent e = live[i];
      live[i] = live.back();
      live.pop_back();
      ASSERT_TRUE(alloc.Free(e).ok());
      for (uint64_t p = e.offset / kPageSize; p < (e.offset + e.length) / kPageSize; ++p) {
        model.used[e.file][p] = false;
      }
    }
    // Coalescing: the allocator's free extents are exactly the model's maximal runs.
    ASSERT_EQ(alloc.free_extent_count(), model.Runs().size()) << "step " << step;
  }
  for (const Extent& e : live) ASSERT_TRUE(alloc.Free(e).ok());
  EXPECT_EQ(alloc.used(), 0u);
  EXPECT_EQ(alloc.free_extent_count(), 3u);
  EXPECT_EQ(alloc.largest_free(), 100 * kPageSize);
}

TEST(ExtentAllocator, DoubleFreeAndInvalidExtentsAreRejected) {
  ExtentAllocator alloc({16 * kPageSize});
  auto a = alloc.Allocate(kPageSize);
  auto b = alloc.Allocate(2 * kPageSize);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(alloc.Free(*a).ok());
  EXPECT_EQ(ToCode(alloc.Free(*a)), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(alloc.Free(Extent{1, 0, kPageSize})), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(alloc.Free(Extent{0, 100, kPageSize})), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(alloc.Free(Extent{0, 15 * kPageSize, 2 * kPageSize})), Code::kInvalidArgument);
  EXPECT_EQ(alloc.used(), 2 * kPageSize);
  EXPECT_FALSE(alloc.Allocate(0).has_value());
  EXPECT_FALSE(alloc.Allocate(17 * kPageSize).has_value());
}

TEST(ExtentAllocator, MarkUsedRebuildsStateForRecovery) {
  ExtentAllocator alloc({16 * kPageSize, 16 * kPageSize});
  ASSERT_TRUE(alloc.MarkUsed(Extent{0, 4 * kPageSize, 2 * kPageSize}).ok());
  ASSERT_TRUE(alloc.MarkUsed(Extent{1, 0, 16 * kPageSize}).ok());
  EXPECT_EQ(ToCode(alloc.MarkUsed(Extent{0, 5 * kPageSize, kPageSize})), Code::kInvalidArgument);
  EXPECT_EQ(alloc.used(), 18 * kPageSize);
  EXPECT_EQ(alloc.free_extent_count(), 2u);  // [0,4) and [6,16) of file 0
  auto e = alloc.Allocate(4 * kPageSize);
  ASSERT_TRUE(e);
  EXPECT_EQ(*e, (Extent{0, 0, 4 * kPageSize}));  // best fit picks the 4-page hole
  ASSERT_TRUE(alloc.Free(Extent{0, 4 * kPageSize, 2 * kPageSize}).ok());
  ASSERT_TRUE(alloc.Free(*e).ok());
  EXPECT_EQ(alloc.largest_free(), 16 * kPageSize);
}

}  // namespace
}  // namespace mc::offload
