#include "master/offset_allocator.h"

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace mc::master {
namespace {

// The obvious model: the set of allocated ranges; free ranges are its complement, maximal.
class ReferenceModel {
 public:
  ReferenceModel(uint64_t capacity, uint64_t alignment)
      : capacity_(capacity - capacity % alignment), alignment_(alignment) {}
  uint64_t Round(uint64_t size) const { return (size + alignment_ - 1) / alignment_ * alignment_; }
  // Maximal free ranges (offset -> size).
  std::map<uint64_t, uint64_t> FreeRanges() const {
    std::map<uint64_t, uint64_t> out;
    uint64_t cursor = 0;
    for (const auto& [off, size] : allocated_) {
      if (off > cursor) out[cursor] = off - cursor;
      cursor = off + size;
    }
    if (capacity_ > cursor) out[cursor] = capacity_ - cursor;
    return out;
  }
  uint64_t Used() const {
    uint64_t u = 0;
    for (const auto& [off, size] : allocated_) u += size;
    return u;
  }
  std::map<uint64_t, uint64_t>& allocated() { return allocated_; }
  uint64_t capacity() const { return capacity_; }

 private:
  uint64_t capacity_;
  uint64_t alignment_;
  std::map<uint64_t, uint64_t> allocated_;
};

struct Params {
  uint64_t capacity;
  uint64_t alignment;
  uint64_t max_size;
  uint32_t seed;
};

void RunRandomSequence(const Params& p, int ops) {
  SCOPED_TRACE(::testing::Message() << "capacity=" << p.capacity << " alignment=" << p.alignment
                                    << " max_size=" << p.max_size << " seed=" << p.seed);
  OffsetAllocator alloc(p.capacity, p.alignment);
  ReferenceModel model(p.capacity, p.alignment);
  ASSERT_EQ(alloc.capacity(), model.capacity());
  std::mt19937_64 rng(p.seed);
  std::vector<uint64_t> live;  // offsets, for picking a random one to free
  for (int op = 0; op < ops; ++op) {
    bool do_alloc = live.empty() || rng() % 100 < 55;
    if (do_alloc) {
      uint64_t size = 1 + rng() % p.max_size;
      uint64_t rounded = model.Round(size);
      auto free_ranges = model.FreeRanges();
      // Best fit in the model: the smallest maximal free range that holds the rounded size.
      uint64_t best_size = UINT64_MAX;
      for (const auto& [off, fsize] : free_ranges) {
        if (fsize >= rounded) best_size = std::min(best_size, fsize);
      }
      auto got = alloc.Allocate(size);
      if (best_size == UINT64_MAX) {
        ASSERT_FALSE(got.has_value()) << "allocated " << size << " with no free range that fits";
        continue;
      }
      ASSERT_TRUE(got.has_value()) << "spurious failure for size " << size << " (rounded "
                                   << rounded << ") though a free range of " << best_size
                                   << " exists";
      uint64_t off = *got;
      ASSERT_EQ(off % p.alignment, 0u);
      ASSERT_LE(off + rounded, model.capacity());
      // The new range must lie entirely inside one free range of the model: no overlap.
      auto it = free_ranges.upper_bound(off);
      ASSERT_NE(it, free_ranges.begin()) << "offset " << off << " overlaps an allocation";
      --it;
      ASSERT_LE(it->first, off);
      ASSERT_LE(off + rounded, it->first + it->second) << "range overlaps an allocation";
      ASSERT_EQ(it->second, best_size) << "not best fit";
      ASSERT_EQ(alloc.AllocatedSize(off), rounded);
      model.allocated()[off] = rounded;
      live.push_back(off);
    } else {
      size_t idx = rng() % live.size();
      uint64_t off = live[idx];
      live[idx] = live.back();
      live.pop_back();
      ASSERT_TRUE(alloc.Free(off));
      model.allocated().erase(off);
      ASSERT_FALSE(alloc.Free(off)) << "double free accepted";
    }
    ASSERT_EQ(alloc.used(), model.Used());
    ASSERT_EQ(alloc.free_bytes(), model.capacity() - model.Used());
    ASSERT_EQ(alloc.allocation_count(), model.allocated().size());
    auto free_ranges = model.FreeRanges();
    ASSERT_EQ(alloc.free_range_count(), free_ranges.size()) << "free neighbours not coalesced";
    uint64_t largest = 0;
    for (const auto& [off, fsize] : free_ranges) largest = std::max(largest, fsize);
    ASSERT_EQ(alloc.largest_free(), largest);
  }
  // Free everything: one free range equal to the capacity.
  std::shuffle(live.begin(), live.end(), rng);
  for (uint64_t off : live) ASSERT_TRUE(alloc.Free(off));
  EXPECT_EQ(alloc.used(), 0u);
  EXPECT_EQ(alloc.allocation_count(), 0u);
  EXPECT_EQ(alloc.free_range_count(), 1u);
  EXPECT_EQ(alloc.largest_free(), alloc.capacity());
}

TEST(OffsetAllocator, RandomSequencesMatchReferenceModel) {
  const Params params[] = {
      {1 << 16, 64, 4096, 1},     {1 << 16, 64, 64, 2},        {1 << 20, 4096, 100'000, 3},
      {1'000'003, 1, 50'000, 4},  {1'000'000, 512, 20'000, 5}, {4096, 64, 4096, 6},
      {(1 << 20) + 100, 256, 300'000, 7}, {1 << 24, 64, 1 << 20, 8},
  };
  for (const Params& p : params) {
    RunRandomSequence(p, 3000);
    if (HasFatalFailure()) return;
  }
}

TEST(OffsetAllocator, ManySeedsSmallCapacityStressCoalescing) {
  for (uint32_t seed = 100; seed < 120; ++seed) {
    RunRandomSequence({8192, 64, 1024, seed}, 2000);
    if (HasFatalFailure()) return;
  }
}

TEST(OffsetAllocator, SizesAreRoundedUpToAlignment) {
  OffsetAllocator alloc(1024, 64);
  auto a = alloc.Allocate(1);
  ASSERT_TRUE(a);
  EXPECT_EQ(alloc.AllocatedSize(*a), 64u);
  EXPECT_EQ(alloc.used(), 64u);
  auto b = alloc.Allocate(65);
  ASSERT_TRUE(b);
  EXPECT_EQ(alloc.AllocatedSize(*b), 128u);
  EXPECT_EQ(*b % 64, 0u);
}

TEST(OffsetAllocator, CapacityIsRoundedDownToAlignment) {
  OffsetAllocator alloc(1000, 64);
  EXPECT_EQ(alloc.capacity(), 960u);
  EXPECT_FALSE(alloc.Allocate(961));
  EXPECT_TRUE(alloc.Allocate(960));
  EXPECT_FALSE(alloc.Allocate(1));
}

TEST(OffsetAllocator, ZeroAndOversizedRequestsFail) {
  OffsetAllocator alloc(4096, 64);
  EXPECT_FALSE(alloc.Allocate(0));
  EXPECT_FALSE(alloc.Allocate(4097));
  EXPECT_FALSE(alloc.Allocate(UINT64_MAX));
  EXPECT_FALSE(alloc.Allocate(UINT64_MAX - 10));
  EXPECT_EQ(alloc.used(), 0u);
}

TEST(OffsetAllocator, FreeOfUnknownOffsetChangesNothing) {
  OffsetAllocator alloc(4096, 64);
  auto a = alloc.Allocate(100);
  ASSERT_TRUE(a);
  EXPECT_FALSE(alloc.Free(*a + 64));
  EXPECT_FALSE(alloc.Free(999999));
  EXPECT_EQ(alloc.used(), 128u);
  EXPECT_EQ(alloc.allocation_count(), 1u);
}

TEST(OffsetAllocator, FragmentedSpaceServesAnyRequestThatFitsOneRange) {
  OffsetAllocator alloc(64 * 100, 64);
  std::vector<uint64_t> offs;
  for (int i = 0; i < 100; ++i) offs.push_back(*alloc.Allocate(64));
  EXPECT_FALSE(alloc.Allocate(1));
  // Free every other block: 50 free blocks, none adjacent.
  for (int i = 0; i < 100; i += 2) alloc.Free(offs[i]);
  EXPECT_EQ(alloc.free_range_count(), 50u);
  EXPECT_FALSE(alloc.Allocate(65)) << "no single range of 128 bytes exists";
  // Free a neighbour: one range of 192 bytes appears and a 129..192-byte request fits.
  alloc.Free(offs[51]);
  auto big = alloc.Allocate(192);
  ASSERT_TRUE(big);
  EXPECT_EQ(*big, offs[50]);
}

TEST(OffsetAllocator, BestFitPrefersSmallestSufficientRange) {
  OffsetAllocator alloc(64 * 10, 64);
  std::vector<uint64_t> offs;
  for (int i = 0; i < 10; ++i) offs.push_back(*alloc.Allocate(64));
  alloc.Free(offs[1]);  // hole of 1 block
  alloc.Free(offs[3]);
  alloc.Free(offs[4]);  // hole of 2 blocks
  alloc.Free(offs[6]);
  alloc.Free(offs[7]);
  alloc.Free(offs[8]);  // hole of 3 blocks
  auto a = alloc.Allocate(128);
  ASSERT_TRUE(a);
  EXPECT_EQ(*a, offs[3]);
  auto b = alloc.Allocate(64);
  ASSERT_TRUE(b);
  EXPECT_EQ(*b, offs[1]);
}

TEST(OffsetAllocator, AllocateAtReservesExactlyTheRangeNamed) {
  OffsetAllocator a(4096, 64);
  ASSERT_TRUE(a.AllocateAt(1024, 100));  // rounded to 128
  EXPECT_EQ(a.AllocatedSize(1024), 128u);
  EXPECT_EQ(a.used(), 128u);
  EXPECT_EQ(a.free_range_count(), 2u) << "the free range is split around it";
  EXPECT_FALSE(a.AllocateAt(1024, 64)) << "same start";
  EXPECT_FALSE(a.AllocateAt(960, 128)) << "overlaps its start";
  EXPECT_FALSE(a.AllocateAt(1088, 64)) << "inside it";
  EXPECT_TRUE(a.AllocateAt(960, 64)) << "touching before is fine";
  EXPECT_TRUE(a.AllocateAt(1152, 64)) << "touching after is fine";
  EXPECT_FALSE(a.AllocateAt(100, 64)) << "unaligned";
  EXPECT_FALSE(a.AllocateAt(0, 0)) << "empty";
  EXPECT_FALSE(a.AllocateAt(4032, 128)) << "past the end";
  EXPECT_FALSE(a.AllocateAt(UINT64_MAX - 63, 64)) << "wraps";
  EXPECT_TRUE(a.AllocateAt(4032, 64)) << "the last granule";
  EXPECT_EQ(a.used(), 128u + 64 + 64 + 64);
  // Allocate fills around the reserved ranges; Free coalesces as for any range.
  ASSERT_TRUE(a.Free(1024));
  ASSERT_TRUE(a.Free(960));
  ASSERT_TRUE(a.Free(1152));
  ASSERT_TRUE(a.Free(4032));
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.free_range_count(), 1u);
  EXPECT_EQ(a.largest_free(), 4096u);
}

TEST(OffsetAllocator, AllocateAtMatchesTheReferenceModelAmongAllocations) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(seed);
    OffsetAllocator alloc(1 << 16, 64);
    ReferenceModel model(1 << 16, 64);
    std::mt19937_64 rng(seed);
    std::vector<uint64_t> live;
    for (int op = 0; op < 2000; ++op) {
      const uint64_t r = rng() % 100;
      if (r < 40 || live.empty()) {
        // Mostly aligned offsets, some not; sizes up to 2 KiB, some running past the end.
        uint64_t offset = (rng() % 1100) * 64 + (rng() % 10 == 0 ? 8 : 0);
        uint64_t size = 1 + rng() % 2048;
        uint64_t rounded = model.Round(size);
        bool fits = offset % 64 == 0 && offset + rounded <= model.capacity();
        for (const auto& [off, sz] : model.allocated()) {
          if (off < offset + rounded && offset < off + sz) fits = false;
        }
        ASSERT_EQ(alloc.AllocateAt(offset, size), fits) << offset << "+" << size;
        if (fits) {
          model.allocated()[offset] = rounded;
          live.push_back(offset);
        }
      } else if (r < 70) {
        auto got = alloc.Allocate(1 + rng() % 1024);
        if (got) {
          ASSERT_FALSE(model.allocated().contains(*got));
          model.allocated()[*got] = alloc.AllocatedSize(*got);
          live.push_back(*got);
        }
      } else {
        size_t i = rng() % live.size();
        ASSERT_TRUE(alloc.Free(live[i]));
        model.allocated().erase(live[i]);
        live[i] = live.back();
        live.pop_back();
      }
      ASSERT_EQ(alloc.used(), model.Used());
      ASSERT_EQ(alloc.free_range_count(), model.FreeRanges().size());
    }
  }
}

}  // namespace
}  // namespace mc::master
